"""The Flask app factory: Flask-SQLAlchemy, the Celery app of Flask's own Celery guide, and
dormant, each configured once in ``app.config`` (``FLASK_*`` variables override it)."""

from celery import Celery, Task
from flask import Flask

from dormant.contrib.flask import Dormant
from dormant.stores.sql.store import upgrade
from shop.models import db

dormant = Dormant()


def create_app() -> Flask:
    app = Flask(__name__)
    app.config.from_mapping(
        SQLALCHEMY_DATABASE_URI="postgresql+psycopg://postgres@127.0.0.1:5432/flask_app",
        CELERY={"broker_url": "redis://127.0.0.1:6379/0", "task_ignore_result": True},
        DORMANT={"SECRET_KEY": "dev-only-not-secret", "SWEEP_INTERVAL_S": 2},
    )
    app.config.from_prefixed_env()  # e.g. FLASK_CELERY__broker_url, FLASK_DORMANT__SECRET_KEY
    db.init_app(app)
    celery_app = celery_init_app(app)
    dormant.init_app(app, celery_app=celery_app, db=db, agents="shop.agents")

    from shop.chat import bp as chat
    from shop.views import bp

    app.register_blueprint(bp)
    app.register_blueprint(chat)

    @app.cli.command("init-db")
    def init_db() -> None:
        """Create the shop's tables and dormant's, in the one database."""
        db.create_all()
        settings = dormant.settings(app)
        upgrade(settings.database_url, table_prefix=settings.table_prefix)
        print("shop and dormant tables are ready")

    return app


def celery_init_app(app: Flask) -> Celery:
    """As in Flask's Celery guide: every task, dormant's included, runs in an app context."""

    class FlaskTask(Task):  # type: ignore[misc]
        def __call__(self, *args: object, **kwargs: object) -> object:
            with app.app_context():
                return self.run(*args, **kwargs)

    celery_app = Celery(app.name, task_cls=FlaskTask)
    celery_app.config_from_object(app.config["CELERY"])
    celery_app.set_default()
    app.extensions["celery"] = celery_app
    return celery_app
