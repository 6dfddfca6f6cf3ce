"""Run a prepared statement (``prepared.py``) on the driver's connection directly.

A cached SQLAlchemy execution still costs tens of microseconds of Python per statement
(cache key, execution context, events, result metadata) against a few for SQLite itself,
and a slice runs a dozen statements. So the hot statements are compiled by SQLAlchemy once
per dialect, and run here on the DBAPI cursor of the very connection (and transaction, or
savepoint) that ``SQLStore._tx`` opened through SQLAlchemy: SQLAlchemy keeps building the
SQL text, converting values (its bind and result processors for the column types, so rows
are stored exactly as before) and translating driver errors into ``sqlalchemy.exc``.
Statements that must stay visible to SQLAlchemy's events still go through ``execute``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement

from dormant.stores.sql.kept import KeptConnections

__all__ = [
    "DirectConnection",
    "Found",
    "Plan",
    "direct_transaction",
    "plan_for",
    "run",
    "run_many",
    "translated",
]

Params = dict[str, Any]


class Found:
    """The rows (as dicts keyed by column name) and row count of one statement."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, rows: list[dict[str, Any]], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount

    def first(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None

    def one(self) -> dict[str, Any]:
        if len(self.rows) != 1:
            raise LookupError(f"expected one row, found {len(self.rows)}")
        return self.rows[0]

    def scalars(self) -> list[Any]:
        return [next(iter(row.values())) for row in self.rows]


class Plan:
    """One statement compiled for one dialect (and, for an INSERT, one set of columns)."""

    __slots__ = ("binders", "defaults", "keys", "order", "readers", "sql")

    def __init__(self, stmt: ClauseElement, dialect: Dialect, column_keys: Sequence[str]) -> None:
        compiled: Any = stmt.compile(dialect=dialect, column_keys=list(column_keys))
        self.sql: str = compiled.string
        if "POSTCOMPILE" in self.sql:
            raise ValueError(f"not runnable directly (expanding parameter): {self.sql}")
        self.order: list[str] | None = list(compiled.positiontup) if compiled.positional else None
        # Constants the statement binds itself (``failures=0``...), by bind name.
        self.defaults: Params = {
            name: bind.effective_value
            for bind, name in compiled.bind_names.items()
            if not bind.required
        }
        self.binders: list[tuple[str, Callable[[Any], Any]]] = [
            (name, proc) for name, proc in compiled._bind_processors.items() if callable(proc)
        ]
        columns = compiled._result_columns
        self.keys: list[str] = [entry.keyname for entry in columns]
        self.readers: list[tuple[int, Callable[[Any], Any]]] = []
        for index, entry in enumerate(columns):
            reader = entry.type._cached_result_processor(dialect, None)
            if reader is not None:
                self.readers.append((index, reader))

    def bind(self, params: Params) -> Any:
        values = {**self.defaults, **params}
        for name, proc in self.binders:
            values[name] = proc(values[name])
        if self.order is not None:
            return tuple(values[name] for name in self.order)
        return values

    def row(self, raw: Sequence[Any]) -> dict[str, Any]:
        if not self.readers:
            return dict(zip(self.keys, raw, strict=True))
        values = list(raw)
        for index, reader in self.readers:
            values[index] = reader(values[index])
        return dict(zip(self.keys, values, strict=True))


_plans: dict[tuple[int, str, tuple[str, ...]], Plan] = {}
"""Compiled plans by (statement, dialect, insert columns): statements live as long as the
process (``prepared.py`` builds them once), so their ids are stable keys."""


def plan_for(conn: Connection, stmt: ClauseElement, params: Params) -> Plan:
    """``stmt`` compiled for ``conn``'s database (once: the plans are kept)."""
    columns = tuple(params) if getattr(stmt, "is_insert", False) else ()
    key = (id(stmt), conn.dialect.name, columns)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = Plan(stmt, conn.dialect, columns)
    return plan


def run(conn: Connection, stmt: ClauseElement, params: Params | None = None) -> Found:
    """Run ``stmt`` once on ``conn``'s driver connection, in its open transaction."""
    params = params or {}
    plan = plan_for(conn, stmt, params)
    bound = plan.bind(params)
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(plan.sql, bound)
        rows = [plan.row(r) for r in cursor.fetchall()] if plan.keys else []
        return Found(rows, cursor.rowcount)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise translated(conn, plan, bound, exc) from exc
    finally:
        cursor.close()


def run_many(conn: Connection, stmt: ClauseElement, many: list[Params]) -> None:
    """Run ``stmt`` once per parameter dict (the driver's ``executemany``); no rows back.
    Every dict has the same keys."""
    if not many:
        return
    plan = plan_for(conn, stmt, many[0])
    bound = [plan.bind(params) for params in many]
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        if len(bound) == 1:  # psycopg's executemany opens a pipeline: dearer for one row
            cursor.execute(plan.sql, bound[0])
        else:
            cursor.executemany(plan.sql, bound)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise translated(conn, plan, bound, exc) from exc
    finally:
        cursor.close()


def translated(conn: Connection, plan: Plan, bound: Any, exc: Exception) -> Exception:
    """The ``sqlalchemy.exc`` error SQLAlchemy would have raised (``IntegrityError``,
    ``OperationalError``...), so callers and ``retry_busy`` see one kind of error."""
    dialect = conn.dialect
    return DBAPIError.instance(plan.sql, bound, exc, dialect.loaded_dbapi.Error, dialect=dialect)


class DirectConnection:
    """A pooled driver connection in a transaction begun here, shaped like the parts of
    SQLAlchemy's ``Connection`` that ``run``, ``run_many`` and ``rows.tables`` use
    (``connection.dbapi_connection``, ``dialect``, ``get_execution_options``). Opening
    and committing it skips SQLAlchemy's per-transaction machinery (events, the
    ``Connection`` and ``Transaction`` objects), which cost more than a slice's SQL."""

    __slots__ = ("_options", "connection", "dialect")

    def __init__(self, fairy: Any, dialect: Dialect, options: dict[str, Any]) -> None:
        self.connection = fairy
        self.dialect = dialect
        self._options = options

    def get_execution_options(self) -> dict[str, Any]:
        return self._options


@contextmanager
def direct_transaction(
    engine: Engine,
    options: dict[str, Any],
    *,
    begin: str | None,
    snapshot: bool,
    alone: bool = False,
    kept: KeptConnections | None = None,
) -> Iterator[Any]:
    """One transaction on a pooled driver connection: SQLite's begins with ``BEGIN
    {begin}`` (the engine's connections are in autocommit mode, ``engine.py``);
    PostgreSQL's implicitly, at REPEATABLE READ with ``snapshot``. Committed on success,
    rolled back on any error; driver errors come out as ``sqlalchemy.exc`` errors.

    ``alone`` (PostgreSQL): the body runs one statement, which is its own transaction
    (autocommit): one round trip, where ``BEGIN``, the statement and ``COMMIT`` are three.
    ``kept``: the thread's own connection (a SQLite file, ``kept.py``), not the pool's."""
    dialect = engine.dialect
    dbapi_error = dialect.loaded_dbapi.Error
    try:
        fairy = kept.get() if kept is not None else engine.raw_connection()
    except dbapi_error as exc:  # the server refused or is unreachable: not yet translated
        raise DBAPIError.instance(None, None, exc, dbapi_error, dialect=dialect) from exc
    raw = fairy.dbapi_connection
    postgres = dialect.name == "postgresql"
    isolated = postgres and snapshot
    alone = postgres and alone
    try:
        try:
            if alone:
                raw.autocommit = True  # type: ignore[union-attr]
            elif begin is not None:
                raw.execute(f"BEGIN {begin}")  # type: ignore[union-attr]
            elif isolated:
                raw.isolation_level = _repeatable_read()  # type: ignore[union-attr]
            yield DirectConnection(fairy, dialect, options)
            raw.commit()  # type: ignore[union-attr]
        except BaseException as exc:
            try:
                raw.rollback()  # type: ignore[union-attr]
            except dbapi_error:
                fairy.invalidate()
            if isinstance(exc, dbapi_error):
                # Not twice: a failed rollback above has invalidated it already.
                if fairy.dbapi_connection is not None and dialect.is_disconnect(exc, raw, None):
                    fairy.invalidate()
                raise DBAPIError.instance(None, None, exc, dbapi_error, dialect=dialect) from exc
            raise
        finally:
            if (isolated or alone) and fairy.dbapi_connection is not None:
                if isolated:
                    raw.isolation_level = None  # type: ignore[union-attr]
                if alone and not raw.closed:  # type: ignore[union-attr]
                    raw.autocommit = False  # type: ignore[union-attr]
    finally:
        if kept is None:
            fairy.close()  # back to the pool


def _repeatable_read() -> Any:
    from psycopg import IsolationLevel

    return IsolationLevel.REPEATABLE_READ
