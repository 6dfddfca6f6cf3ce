"""Database fixtures: every store test runs on memory, a SQLite file and real PostgreSQL.

PostgreSQL is the one at ``DORMANT_TEST_POSTGRES_URL`` (default: the local server, user
postgres). A throwaway database is created for the session, migrated with ``upgrade()`` and
dropped at the end. Without a server the PostgreSQL cases are skipped loudly, except in CI
(``CI=true``) where a missing server is a failure.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import OperationalError

from dormant.stores.base import Store
from dormant.stores.memory import MemoryStore
from dormant.stores.sql import SQLStore, upgrade
from dormant.stores.tables import metadata
from tests.fake_providers import no_external_network  # noqa: F401  (autouse: no internet)

POSTGRES_ADMIN_URL = os.environ.get(
    "DORMANT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
BACKENDS = ["memory", "sqlite", "postgres"]

StoreOpener = Callable[[], Store]
"""Opens another store on the same database (the memory backend has only one)."""


def _admin_engine() -> Engine:
    url = make_url(POSTGRES_ADMIN_URL).set(drivername="postgresql+psycopg")
    return create_engine(url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(f"!!! PostgreSQL UNAVAILABLE, PostgreSQL store tests NOT RUN: {reason}")


def _drop_database(admin: Engine, name: str) -> None:
    with admin.connect() as conn:
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = :name AND pid <> pg_backend_pid()"
            ),
            {"name": name},
        )
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A migrated, session-private PostgreSQL database (a plain ``postgresql://`` URL)."""
    admin = _admin_engine()
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        admin.dispose()
        _unavailable(f"cannot connect to {POSTGRES_ADMIN_URL}: {exc}")
    name = f"dormant_test_{secrets.token_hex(6)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url: URL = make_url(POSTGRES_ADMIN_URL).set(database=name)
    try:
        upgrade(url.render_as_string(hide_password=False))
        yield url.render_as_string(hide_password=False)
    finally:
        _drop_database(admin, name)
        admin.dispose()


def _truncate_postgres(url: str) -> None:
    """Empty every table so each test starts from nothing, ids included."""
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
    names = ", ".join(t.name for t in metadata.sorted_tables)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    finally:
        engine.dispose()


@pytest.fixture(params=BACKENDS)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreOpener]:
    """A way to open stores on one fresh database of the parametrized backend."""
    opened: list[Store] = []
    if request.param == "memory":
        shared = MemoryStore()
        opened.append(shared)

        def opener() -> Store:
            return shared

    else:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path}/dormant.db"
            upgrade(url)
        else:
            url = request.getfixturevalue("postgres_url")
            _truncate_postgres(url)

        def opener() -> Store:
            store = SQLStore(url)
            opened.append(store)
            return store

    yield opener
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: StoreOpener) -> Store:
    """An empty store of each backend: memory, a SQLite file, PostgreSQL."""
    return open_store()
