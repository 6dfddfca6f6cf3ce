"""Which schema this dormant was written for, and the check that the database has it.

A database a migration behind fails deep in the first statement that names a new column
("no such column" on SQLite, an ``UndefinedColumn`` on PostgreSQL), long after a worker
said ``ready.``; one a migration ahead (a newer release migrated it) may fail the same way
or, worse, not at all. So a store reads the version table once, before its first
transaction, and refuses any schema but its own with both versions and the fix. The
revisions known are the file names of ``migrations/versions`` (``0010_packed_items.py``):
nothing is imported to read them, and a test holds them equal to Alembic's.
"""

from __future__ import annotations

import functools
import logging
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from dormant.errors import SchemaMismatch, SchemaMissing
from dormant.stores.outages import unreachable_server
from dormant.stores.sql.engine import make_engine

__all__ = [
    "VERSION_TABLE",
    "SchemaCheck",
    "check_version",
    "known_revisions",
    "refuse_another_schema",
    "refuse_unknown",
    "schema_head",
    "stored_version",
]

VERSION_TABLE = "dormant_alembic_version"
"""Not ``alembic_version``: an application's own migrations may share the database. With a
table prefix it is prefixed too (``myapp_dormant_alembic_version``)."""

log = logging.getLogger("dormant.sql")

_VERSIONS_DIR = Path(__file__).parent.parent / "migrations" / "versions"


@functools.cache
def known_revisions() -> tuple[str, ...]:
    """Every shipped revision, oldest first (each file's four-digit prefix)."""
    names = (p.name for p in _VERSIONS_DIR.glob("[0-9][0-9][0-9][0-9]_*.py"))
    return tuple(sorted(name[:4] for name in names))


def schema_head() -> str:
    """The revision this dormant's code reads and writes."""
    return known_revisions()[-1]


def stored_version(conn: Connection, table_prefix: str) -> str | None:
    """The database's revision, or None when it has no dormant schema (no version table,
    or an empty one: migrated down to nothing)."""
    table = table_prefix + VERSION_TABLE  # Settings checked the prefix: [a-z0-9_]
    try:
        # A savepoint on PostgreSQL: a missing table must not end the caller's transaction.
        with conn.begin_nested() if conn.in_transaction() else conn.begin():
            found = conn.execute(text(f"SELECT version_num FROM {table}")).scalars().all()
    except DBAPIError as error:
        if _is_missing_table(error):
            return None
        raise
    return found[0] if len(found) == 1 else None


def check_version(conn: Connection, table_prefix: str) -> SchemaMismatch | None:
    """Refuse a schema older than ``schema_head()`` or none at all (raised); return a
    schema this dormant does not know, newer, as a notice for the caller to say.

    A newer schema is not refused: deploying runs the migration first and then rolls the
    processes (docs/deploy.md), so the processes of the earlier release meet it by design,
    and one restarted or scaled up meanwhile must start."""
    found = stored_version(conn, table_prefix)
    needed = schema_head()
    if found is None:
        raise SchemaMissing("the database has no dormant tables (no dormant schema version)")
    if found == needed:
        return None
    mismatch = SchemaMismatch(found, needed, ahead=found not in known_revisions())
    if not mismatch.ahead:
        raise mismatch
    return mismatch


def refuse_unknown(conn: Connection, table_prefix: str) -> str | None:
    """Before a migration: refuse a schema this dormant does not know (a later release's),
    which Alembic would report only as a revision it cannot locate; the stored revision."""
    found = stored_version(conn, table_prefix)
    if found is not None and found not in known_revisions():
        raise SchemaMismatch(found, schema_head(), ahead=True)
    return found


class SchemaCheck:
    """``SQLStore``'s check of its database's schema, made once, before its first
    transaction (``_tx`` calls ``_check_schema_and_say`` until it passed)."""

    _engine: Engine
    _serial: AbstractContextManager[Any]
    _table_prefix: str
    _schema_checked: bool

    def check_schema(self, *, at_start: bool = False) -> SchemaMismatch | None:
        """Refuse a database whose schema is older than this dormant's, or absent
        (``SchemaMismatch``, ``SchemaMissing``), with one query the first time, none after;
        a newer one is returned the first time, for the caller to say.

        ``at_start`` (a client being built): a database unreachable now, or without
        dormant's tables yet (created by ``dormant db upgrade`` after the application
        started, as tests and first deployments do), is let through and checked again at
        the first transaction; only a schema of another version refuses the start."""
        if self._schema_checked:
            return None
        if at_start and _no_sqlite_file_yet(self._engine):
            return None  # connecting would create it, empty: the first write does that
        try:
            with self._serial, self._engine.connect() as conn:
                ahead = check_version(conn, self._table_prefix)
        except SchemaMissing:
            if at_start:
                return None
            raise
        except Exception as error:
            if at_start and unreachable_server(error) == "the database":
                return None
            raise
        self._schema_checked = True
        return ahead

    def _check_schema_and_say(self) -> None:
        ahead = self.check_schema()
        if ahead is not None:
            log.warning("%s", ahead)


def refuse_another_schema(database_url: str, table_prefix: str) -> None:
    """For a process about to start (a worker, beat): raise ``check_version``'s error
    rather than say ``ready.`` and then fail every slice; log a newer schema. A database
    unreachable now is let through: the process starts during an outage, and its store
    checks the schema before its first transaction."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            ahead = check_version(conn, table_prefix)
    except Exception as error:
        if unreachable_server(error) != "the database":
            raise
        return
    finally:
        engine.dispose()
    if ahead is not None:
        log.warning("%s", ahead)


def _no_sqlite_file_yet(engine: Engine) -> bool:
    url = engine.url
    path = url.database or ""
    if url.get_backend_name() != "sqlite" or path in ("", ":memory:") or url.query:
        return False  # a server, memory, or a URI filename (mode=...): it says what it wants
    return not Path(path).exists()


def _is_missing_table(error: DBAPIError) -> bool:
    orig = error.orig
    if getattr(orig, "sqlstate", None) == "42P01":  # PostgreSQL: undefined_table
        return True
    return str(orig).startswith("no such table")  # SQLite
