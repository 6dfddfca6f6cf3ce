"""How a command reaches the deployment: its settings, the store it reads, a client.

Each imports the database or Celery code only when called, so ``dormant --help`` pays for
none of it. Settings come from the ``DORMANT_*`` variables, or from the host framework when
a command runs under ``python manage.py dormant`` or ``flask dormant`` (``hosted_settings``):
there the framework's configuration is the one place, as it is for the web processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from dormant.cli.errors import DATABASE_URL
from dormant.settings import redact

if TYPE_CHECKING:
    from pathlib import Path

    from celery import Celery

    from dormant.client import Client
    from dormant.settings import Settings
    from dormant.stores.sql.store import SQLStore

__all__ = [
    "check_database",
    "check_schema",
    "checked_database_url",
    "env_settings",
    "hosted_celery_app",
    "hosted_settings",
    "is_hosted",
    "open_client",
    "open_store",
    "redact",
    "verifying_settings",
]


_HOST_SETTINGS: ContextVar[Callable[[], Settings] | None] = ContextVar(
    "dormant_host_settings", default=None
)
_HOST_CELERY_APP: ContextVar[Celery | None] = ContextVar("dormant_host_celery_app", default=None)


@contextmanager
def hosted_settings(
    settings: Callable[[], Settings], celery_app: Celery | None = None
) -> Iterator[None]:
    """Commands run inside take their settings from ``settings`` (Django's or Flask's),
    not from the process environment; with ``celery_app`` (the project's own), their wakes
    go through it, as the web processes' do: its broker transport options (a
    ``global_keyprefix``, Sentinel's ``master_name``, TLS) are the ones the workers read."""
    token = _HOST_SETTINGS.set(settings)
    app_token = _HOST_CELERY_APP.set(celery_app)
    try:
        yield
    finally:
        _HOST_CELERY_APP.reset(app_token)
        _HOST_SETTINGS.reset(token)


def hosted_celery_app() -> Celery | None:
    """The host project's Celery app, where a command runs under one (``hosted_settings``)."""
    return _HOST_CELERY_APP.get()


def is_hosted() -> bool:
    return _HOST_SETTINGS.get() is not None


def env_settings() -> Settings:
    """The command's settings: the host framework's, else the ``DORMANT_*`` variables."""
    from dormant.settings import Settings

    hosted = _HOST_SETTINGS.get()
    return hosted() if hosted is not None else Settings.from_env()


def open_client(agents_module: str | None = None, *, verifies_urls: bool = False) -> Client:
    """A client for the ``DORMANT_*`` URLs; with agents (``--agents`` or ``DORMANT_AGENTS``)
    given to ``launch``, unknown agent names are refused before anything is stored.

    ``verifies_urls``: the client answers callback URLs, so it needs the key that signed
    them: ``DORMANT_SECRET_KEY``, or on a SQLite file the key ``LocalSystem`` keeps beside
    it; with neither, a ``ConfigurationError``."""
    from dormant.cli.client import connect_client

    current = verifying_settings() if verifies_urls else _checked_settings()
    return connect_client(
        current, agents_module, check_database=check_database, celery_app=hosted_celery_app()
    )


def verifying_settings() -> Settings:
    """The settings of a process that answers callback URLs (``dormant callbacks``,
    ``dormant serve``): it needs the key that signed them, ``DORMANT_SECRET_KEY`` or, on a
    SQLite file, the key ``LocalSystem`` keeps beside it; with neither, a
    ``ConfigurationError``."""
    return _checked_settings().with_local_secret(verify_only=True).require_secret()


def _checked_settings() -> Settings:
    """``env_settings``, its database URL checked (one line for a malformed one)."""
    current = env_settings()
    checked_database_url(current.database_url)
    return current


def open_store(url: str | None) -> SQLStore:
    """The store to read; never creates a database (a missing SQLite file is an error)."""
    from dormant.stores.sql.store import SQLStore

    current = env_settings()
    url = checked_database_url(url or current.database_url)
    check_database(url)
    store = SQLStore(url, table_prefix=current.table_prefix)
    try:
        ahead = store.check_schema()
    except Exception:
        store.close()
        raise
    if ahead is not None:
        from dormant.cli.errors import say

        say(f"warning: {ahead}")
    return store


def check_schema(settings: Settings) -> None:
    """Before a worker or beat starts: refuse a missing SQLite file or a schema of another
    version (``stores/sql/versions.py``); an unreachable database is let through."""
    from dormant.stores.sql.versions import refuse_another_schema

    url = checked_database_url(settings.database_url)
    check_database(url)
    refuse_another_schema(url, settings.table_prefix)


def checked_database_url(url: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from dormant.errors import ConfigurationError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigurationError(
            f"{url!r} is not a database URL: use sqlite:///path/to/file.db or "
            "postgresql://user@host/dbname"
        ) from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql", "postgres"):
        raise ConfigurationError(
            f"unsupported database {redact(url)!r}: use sqlite:// or postgresql://"
        )
    DATABASE_URL.set(url)
    return url


def check_database(url: str) -> None:
    """Refuse a SQLite file that does not exist: opening it would create an empty one."""
    from dormant.errors import SchemaMissing

    path = _sqlite_path(url)
    if path is not None and not path.is_file():
        raise SchemaMissing(f"there is no SQLite database at {str(path)!r}")


def check_sqlite_directory(url: str) -> None:
    """Refuse a SQLite file whose directory does not exist, naming the directory: SQLite
    itself says only "unable to open database file", which reads as a server down."""
    from dormant.errors import ConfigurationError

    path = _sqlite_path(url)
    if path is not None and not path.parent.is_dir():
        raise ConfigurationError(
            f"cannot create the SQLite database {str(path)!r}: its directory "
            f"{str(path.parent)!r} does not exist (create it first)"
        )


def _sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for another database, SQLite in memory, or a SQLite
    URI filename (``mode=ro``...), which says itself what may be created."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    path = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or path in ("", ":memory:"):
        return None
    if parsed.query.get("uri") or path.startswith("file:"):
        return None
    return Path(path)
