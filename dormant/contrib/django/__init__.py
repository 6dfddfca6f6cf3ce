"""Django: dormant configured in ``settings.py``, its schema made by ``manage.py migrate``,
its launches tied to ``transaction.on_commit``.

``settings.py``::

    INSTALLED_APPS = [..., "dormant.contrib.django"]   # migrate also makes its schema
    CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
    DORMANT = {"SECRET_KEY": "...", "AGENTS": "myapp.agents"}

``proj/celery.py``: ``dormant.contrib.django.install(app)``; in a view:
``dormant_client(app).launch_on_commit("triage", text)``. ``DORMANT`` takes the names of
docs/celery.md without ``DORMANT_``; ``DATABASE_URL`` defaults to ``DATABASES["default"]``
(PostgreSQL or SQLite) and ``REDIS_URL`` to the Celery broker when it is Redis. Django is
imported only when these functions run.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL

from dormant.contrib._settings import redis_url_of, settings_from
from dormant.errors import ConfigurationError
from dormant.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

    from dormant.agents import AgentSource
    from dormant.client import Client

__all__ = ["database_url", "dormant_client", "install", "settings"]


def settings(celery_app: Celery | None = None) -> Settings:
    """dormant's ``Settings`` from Django's settings (``DORMANT``, ``DATABASES``, the
    Celery broker of ``celery_app`` or ``CELERY_BROKER_URL``)."""
    from django.conf import settings as django_settings

    values = getattr(django_settings, "DORMANT", {}) or {}
    broker = (
        celery_app.conf.broker_url
        if celery_app is not None
        else getattr(django_settings, "CELERY_BROKER_URL", None)
    )
    defaults: dict[str, str] = {}
    if "DATABASE_URL" not in values:
        defaults["DATABASE_URL"] = database_url(django_settings.DATABASES["default"])
    if isinstance(broker, str) and broker:
        defaults["BROKER_URL"] = broker
        redis_url = redis_url_of(broker)
        if redis_url:
            defaults["REDIS_URL"] = redis_url
    return settings_from(values, defaults, "settings.DORMANT")


def database_url(database: dict[str, Any]) -> str:
    """A SQLAlchemy URL for one entry of Django's ``DATABASES`` (PostgreSQL or SQLite)."""
    engine = str(database.get("ENGINE", ""))
    name = str(database.get("NAME") or "")
    if engine.endswith(".sqlite3"):
        return f"sqlite:///{name}"
    if engine.endswith((".postgresql", ".postgis")):
        port = database.get("PORT")
        url = URL.create(
            "postgresql",
            username=database.get("USER") or None,
            password=database.get("PASSWORD") or None,
            host=database.get("HOST") or None,
            port=int(port) if port else None,
            database=name,
        )
        return url.render_as_string(hide_password=False)
    raise ConfigurationError(
        f"DATABASES['default'] uses {engine!r}: set DORMANT['DATABASE_URL'] "
        "(dormant runs on PostgreSQL or SQLite)"
    )


def install(celery_app: Celery, agents: AgentSource = None) -> None:
    """``dormant.worker.install`` with settings read from Django's when first needed
    (``proj/celery.py`` is imported before Django's settings are ready)."""
    from dormant.worker import install as install_worker

    install_worker(celery_app, agents, settings=lambda: settings(celery_app))


@functools.cache
def dormant_client(celery_app: Celery) -> Client:
    """The process's ``Client``: wakes go through ``celery_app`` (its broker settings), and
    ``launch_on_commit``/``send_on_commit`` use ``transaction.on_commit``."""
    from django.db import transaction

    from dormant.client import Client

    return Client.from_celery(celery_app, settings(celery_app), on_commit=transaction.on_commit)
