"""A migrated PostgreSQL database private to one test session, dropped afterwards."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from dormant.stores.sql.store import upgrade

POSTGRES_ADMIN_URL = os.environ.get(
    "DORMANT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def admin_engine() -> Engine:
    url = make_url(POSTGRES_ADMIN_URL).set(drivername="postgresql+psycopg")
    return create_engine(url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})


@contextmanager
def temporary_database(prefix: str, unavailable: Callable[[str], None]) -> Iterator[str]:
    """Create ``{prefix}_<hex>``, migrate it, yield its URL, drop it (connections killed).

    ``unavailable`` is called with the reason when the server cannot be reached: it skips
    locally and fails in CI.
    """
    with empty_database(prefix, unavailable) as url:
        upgrade(url)
        yield url


@contextmanager
def empty_database(prefix: str, unavailable: Callable[[str], None]) -> Iterator[str]:
    """Create ``{prefix}_<hex>`` with no tables at all, yield its URL, drop it."""
    admin = admin_engine()
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        admin.dispose()
        unavailable(f"cannot connect to PostgreSQL at {POSTGRES_ADMIN_URL}: {exc}")
    name = f"{prefix}_{secrets.token_hex(6)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()
