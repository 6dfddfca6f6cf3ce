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
imported only when these functions run. ``python manage.py dormant ...`` runs the
``dormant`` command with these settings (``management/commands/dormant.py``).
``stream_response(request, client, thread_id)`` serves a thread's stream as Server-Sent
Events behind the project's own auth (``stream.py``).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL

from dormant.contrib._settings import redis_url_of, settings_from
from dormant.contrib.django.stream import stream_response
from dormant.errors import ConfigurationError
from dormant.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

    from dormant.agents import AgentRegistry, AgentSource
    from dormant.client import Client

__all__ = [
    "close_clients",
    "database_url",
    "dormant_client",
    "install",
    "settings",
    "stream_response",
]


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
        if name.startswith("file:"):  # a URI filename: the test runner's in-memory database
            return f"sqlite:///{name}{'&' if '?' in name else '?'}uri=true"
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

    _CLIENTS.agents_of[celery_app] = agents
    install_worker(celery_app, agents, settings=lambda: settings(celery_app))


def installed_app() -> Celery | None:
    """The Celery app ``install`` was given in this process (the project's
    ``proj/celery.py``, imported with its package), or None when there is none or several:
    ``python manage.py dormant`` sends through it, as the project's web processes do."""
    apps = list(_CLIENTS.agents_of.keys())
    return apps[0] if len(apps) == 1 else None


def dormant_client(celery_app: Celery) -> Client:
    """The process's ``Client``: wakes go through ``celery_app`` (its broker settings), and
    ``launch_on_commit``/``send_on_commit`` use ``transaction.on_commit``.

    It knows the agents (those given to ``install``, else ``DORMANT["AGENTS"]``), so a
    mistyped agent name is refused at launch instead of stalling the thread on a worker.
    """
    return _CLIENTS.get(celery_app)


def close_clients() -> None:
    """Close the process's clients (the next ``dormant_client`` builds a new one).

    Called before Django creates, clones or drops a database (it then connects to none:
    ``manage.py test``'s set-up and teardown): a client's pooled connection to the test
    database would make ``DROP DATABASE`` fail, and a client built before the test database
    existed would keep writing to the real one."""
    _CLIENTS.close_all()


class _Clients:
    """One client per Celery app in this process, and the agents ``install`` was given."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clients: dict[int, tuple[Celery, Client]] = {}
        self.agents_of: weakref.WeakKeyDictionary[Celery, AgentSource] = weakref.WeakKeyDictionary()

    def get(self, celery_app: Celery) -> Client:
        with self.lock:
            found = self.clients.get(id(celery_app))
            if found is None:
                found = (celery_app, self._build(celery_app))
                self.clients[id(celery_app)] = found
            return found[1]

    def close_all(self) -> None:
        with self.lock:
            clients = [client for _, client in self.clients.values()]
            self.clients.clear()
        for client in clients:
            client.close()

    def _build(self, celery_app: Celery) -> Client:
        from django.db import transaction
        from django.db.backends.signals import connection_created

        from dormant.client import Client

        connection_created.connect(_close_before_database_change, dispatch_uid="dormant.clients")
        current = settings(celery_app)
        return Client.from_celery(
            celery_app,
            current,
            agents=self._agents(celery_app, current),
            on_commit=transaction.on_commit,
        )

    def _agents(self, celery_app: Celery, current: Settings) -> AgentRegistry | None:
        from dormant.agents import load_agents

        source = self.agents_of.get(celery_app)
        if source is None and not current.agents_module:
            return None  # nowhere to learn the agents: names are checked by the worker
        return load_agents(source, current)


_CLIENTS = _Clients()


def _close_before_database_change(connection: Any = None, **_: Any) -> None:
    """Django connects to no database only to create, clone or drop one."""
    from django.db.backends.base.base import NO_DB_ALIAS

    if getattr(connection, "alias", None) == NO_DB_ALIAS:
        close_clients()
