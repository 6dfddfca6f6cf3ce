"""``celery -A make_celery worker``: the Flask app's Celery app, dormant's tasks installed."""

from shop import create_app

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
