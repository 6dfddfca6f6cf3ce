"""Database fixtures: every store test runs on memory, a SQLite file and real PostgreSQL.

PostgreSQL is the one at ``DORMANT_TEST_POSTGRES_URL`` (default: the local server, user
postgres). A throwaway database is created for the session, migrated with ``upgrade()`` and
dropped at the end. Without a server the PostgreSQL cases are skipped loudly, except in CI
(``CI=true``) where a missing server is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from dormant.stores.base import Store
from dormant.stores.memory.store import MemoryStore
from dormant.stores.sql.store import SQLStore, upgrade
from dormant.stores.sql.tables import metadata
from tests.databases import temporary_database
from tests.fake_providers import no_external_network  # noqa: F401  (autouse: no internet)

BACKENDS = ["memory", "sqlite", "postgres"]

StoreOpener = Callable[[], Store]
"""Opens another store on the same database (the memory backend has only one)."""


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(f"!!! PostgreSQL UNAVAILABLE, PostgreSQL store tests NOT RUN: {reason}")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A migrated, session-private PostgreSQL database (a plain ``postgresql://`` URL)."""
    with temporary_database("dormant_test", _unavailable) as url:
        yield url


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
