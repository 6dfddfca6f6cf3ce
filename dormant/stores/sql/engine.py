"""Engines for the SQL store: PostgreSQL through psycopg 3, and SQLite set up to wait.

SQLite has one writer at a time. A file runs in WAL mode (readers never block the writer)
with ``synchronous=NORMAL``; write transactions start with ``BEGIN IMMEDIATE`` (chosen per
connection through the ``SQLITE_BEGIN`` execution option), so a writer never has to
upgrade a read snapshot, which could deadlock; another process's lock is waited for up to
``SQLITE_BUSY_TIMEOUT_MS``; and ``retry_busy`` runs a transaction that still met a busy
database again, a bounded number of times.
"""

from __future__ import annotations

import functools
import logging
import random
import sqlite3
import time
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.pool import StaticPool

from dormant.errors import ConfigurationError

__all__ = [
    "PING_IDLE_S",
    "SQLITE_BEGIN",
    "SQLITE_BUSY_ATTEMPTS",
    "SQLITE_BUSY_TIMEOUT_MS",
    "is_busy",
    "is_memory",
    "make_engine",
    "retry_busy",
]

SQLITE_BUSY_TIMEOUT_MS = 10_000
"""How long SQLite waits for another connection's write lock before reporting it busy."""
SQLITE_BUSY_ATTEMPTS = 6
"""Runs of one transaction that met a busy database, the first included."""
SQLITE_BEGIN = "dormant_sqlite_begin"
"""The execution option naming how a SQLite transaction begins (``IMMEDIATE`` to write)."""
PING_IDLE_S = 1.0
"""A pooled PostgreSQL connection unused for longer is pinged before it is lent."""
_USED_AT = "dormant_used_at"
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_JITTER = random.Random()
"""Busy waits draw from a stream of their own, never the application's global ``random``."""

log = logging.getLogger("dormant.sql")

_S = TypeVar("_S")
_P = ParamSpec("_P")
_T = TypeVar("_T")


def make_engine(database_url: str, *, echo: bool = False) -> Engine:
    """An engine for ``sqlite://...`` or ``postgresql://...`` (driven by psycopg 3)."""
    url = make_url(database_url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    backend = url.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url, echo)
    if backend == "postgresql":
        return _postgres_engine(url, echo)
    shown = url.render_as_string(hide_password=True)
    raise ConfigurationError(f"unsupported database {shown!r}: use sqlite:// or postgresql://")


def _postgres_engine(url: URL, echo: bool) -> Engine:
    """A pool that pings a connection before lending it only when it sat unused for
    ``PING_IDLE_S``: a dropped server connection is found before it fails a transaction,
    without a round trip per transaction of a busy worker (``pool_pre_ping`` pings always).

    Its sessions run with JIT compilation off: every statement here reads or writes a few
    rows by key, and JIT pays only for long scans. With statistics not yet gathered after
    fast growth (100,000 threads added at once) the planner's estimates for a thread's
    items ran to 200,000 rows, past ``jit_above_cost``, and compiling took 16 ms of a 30 ms
    read that takes 0.1 ms once analyzed (``docs/benchmarks.md``, idle scale)."""
    given = url.query.get("options", "")
    options = " ".join([*((given,) if isinstance(given, str) else given), "-c jit=off"])
    engine = create_engine(url, echo=echo, connect_args={"options": options.strip()})

    def stamp(_dbapi_connection: Any, record: Any) -> None:
        record.info[_USED_AT] = time.monotonic()

    def ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get(_USED_AT, 0.0) <= PING_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError(f"PostgreSQL connection lost: {exc}") from exc
        if not alive:
            raise DisconnectionError("PostgreSQL connection lost")

    event.listen(engine, "checkin", stamp)
    event.listen(engine, "checkout", ping_if_idle)
    return engine


def is_memory(url: URL) -> bool:
    """An in-memory SQLite database: ``:memory:``, or a URI filename with ``mode=memory``
    (Django's test database)."""
    return url.get_backend_name() == "sqlite" and (
        url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"
    )


def _sqlite_engine(url: URL, echo: bool) -> Engine:
    if is_memory(url):
        # One connection for the engine's lifetime: a second would open an empty database.
        engine = create_engine(
            url, echo=echo, poolclass=StaticPool, connect_args={"check_same_thread": False}
        )
    else:
        engine = create_engine(url, echo=echo)
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    """Take transaction control from the sqlite3 module (it never BEGINs before a SELECT)."""
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys = ON")
    _journal_in_wal(cursor)
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.close()


def _journal_in_wal(cursor: sqlite3.Cursor) -> None:
    """Switch the file to WAL, waiting for the lock it needs. The switch (a new file's
    first) takes an exclusive lock for which SQLite's busy handler does not wait: a
    process opening a new file while another migrates it got "database is locked" at
    once. A file already in WAL answers at once."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode not in _BUSY_CODES or time.monotonic() > deadline:
                raise
            time.sleep(_JITTER.uniform(0.005, 0.05))


def _sqlite_begin(conn: Connection) -> None:
    conn.exec_driver_sql(f"BEGIN {conn.get_execution_options().get(SQLITE_BEGIN, 'DEFERRED')}")


def is_busy(exc: OperationalError) -> bool:
    """Whether SQLite reported a busy or locked database (any extended code of those)."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return isinstance(exc.orig, sqlite3.OperationalError) and (
        (code is not None and code & 0xFF in _BUSY_CODES) or "locked" in str(exc.orig)
    )


def retry_busy(method: Callable[Concatenate[_S, _P], _T]) -> Callable[Concatenate[_S, _P], _T]:
    """Run a store method's one transaction again when SQLite stays busy past its timeout
    (the transaction was rolled back: nothing of it was kept)."""

    @functools.wraps(method)
    def run(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        for attempt in range(1, SQLITE_BUSY_ATTEMPTS + 1):
            try:
                return method(self, *args, **kwargs)
            except OperationalError as exc:
                if attempt == SQLITE_BUSY_ATTEMPTS or not is_busy(exc):
                    raise
                wait_s = _JITTER.uniform(0.05, 0.1 * 2**attempt)
                log.warning(
                    "SQLite busy in %s (try %d of %d); again in %.2f s",
                    method.__name__,
                    attempt,
                    SQLITE_BUSY_ATTEMPTS,
                    wait_s,
                )
                time.sleep(wait_s)
        raise AssertionError("unreachable")  # pragma: no cover

    return run
