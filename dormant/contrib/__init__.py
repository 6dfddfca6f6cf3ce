"""Fitting dormant into the stacks its users already run.

``dormant.contrib.django`` (settings from ``settings.DORMANT``, ``manage.py migrate``,
``transaction.on_commit``), ``dormant.contrib.flask`` (``init_app`` reading ``app.config``,
Flask-SQLAlchemy session hooks) and ``dormant.contrib.sqlalchemy`` (writing in the caller's
transaction). Django and Flask are imported only by their own modules, so dormant itself
needs neither.
"""

__all__: list[str] = []
