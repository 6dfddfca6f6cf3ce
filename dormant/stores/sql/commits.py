"""A slice's commit on PostgreSQL in two round trips: the version guard, then the rest.

One statement at a time, a commit is ``BEGIN``, the guard (the thread's ``UPDATE ... WHERE
version = :expected``), the spend ledger's row, the items, the calls, the inbox rows'
fates, the outbox, the timers and ``COMMIT``: six round trips or more a slice. Only the
guard's result decides anything (a moved version writes nothing, and a spend's root is read
from it); nothing after it is read but the outbox rows' ids. So here the guard goes with
``BEGIN`` in one message, and every later statement, bound by the driver (psycopg's
``ClientCursor``, values quoted by it), goes with ``COMMIT`` in a second: the same
statements (``statements.py``, through a cursor that keeps them, ``_Cursor``), in the same
order, in one transaction; a moved version rolls it back. Commits that create threads,
queue messages elsewhere or close a subtree (they read as they write) commit as before.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from dormant.stores.base import Commit, OutboxRow
from dormant.stores.sql import statements as rows
from dormant.stores.sql.direct import DirectConnection, plan_for
from dormant.stores.sql.prepared import prepared
from dormant.stores.sql.rows import outbox_row

__all__ = ["commit_at_once", "plain", "sent_at_once"]


def plain(commit: Commit) -> bool:
    """Whether ``commit`` runs direct (``direct.py``): closing a subtree and messages for
    other threads are rare and still use SQLAlchemy statements."""
    return not (
        commit.close_descendants
        or commit.enqueue
        or commit.closed_reason
        or any(t.messages for t in commit.threads)
    )


def sent_at_once(commit: Commit) -> bool:
    """Whether ``commit`` can go in two round trips: plain, and creating no thread (whose
    ``INSERT`` is read, to refuse a duplicate)."""
    return plain(commit) and not commit.threads


class _Batch:
    """One commit's messages to the server: the guard sent with ``BEGIN``, the rest kept."""

    def __init__(self, raw: Any) -> None:
        from psycopg import ClientCursor

        self.cursor: Any = ClientCursor(raw)
        self.guarded = False
        self.kept: list[str] = []

    def bound(self, sql: str, params: Any) -> str:
        return str(self.cursor.mogrify(sql, params))


class _Cursor:
    """The driver cursor ``direct.run`` and ``run_many`` use inside a commit sent at once:
    the first statement (the guard) runs with ``BEGIN`` and its rows are read; every later
    one is only kept (nothing reads its rows: the outbox's are read in ``commit_at_once``)."""

    def __init__(self, batch: _Batch) -> None:
        self._batch = batch
        self._live = False

    def execute(self, sql: str, params: Any) -> None:
        batch = self._batch
        text = batch.bound(sql, params)
        if batch.guarded:
            batch.kept.append(text)
            return
        batch.guarded = self._live = True
        batch.cursor.execute(f"BEGIN;{text}")
        batch.cursor.nextset()  # from BEGIN's result to the guard's

    def executemany(self, sql: str, many: list[Any]) -> None:
        assert self._batch.guarded, "the guard is one statement"
        for params in many:
            self.execute(sql, params)

    def fetchall(self) -> list[Any]:
        assert self._live, "a kept statement's rows are never read"
        return list(self._batch.cursor.fetchall())

    @property
    def rowcount(self) -> int:
        return int(self._batch.cursor.rowcount) if self._live else -1

    def close(self) -> None:
        pass


class _Driver:
    """Stands for the driver connection: its cursors are ``_Cursor``s of one batch."""

    def __init__(self, batch: _Batch) -> None:
        self._batch = batch

    def cursor(self) -> _Cursor:
        return _Cursor(self._batch)


class _Pooled:
    """Stands for the pool's connection (``DirectConnection.connection``)."""

    def __init__(self, driver: _Driver) -> None:
        self.dbapi_connection = driver


def commit_at_once(conn: Connection, commit: Commit, now: datetime) -> list[OutboxRow] | None:
    """``Store.commit`` of a plain commit (``store.py`` says which) on ``conn``, a driver
    connection in autocommit: the new outbox rows, or None when the version moved."""
    raw: Any = conn.connection.dbapi_connection
    batch = _Batch(raw)
    view: Any = DirectConnection(
        _Pooled(_Driver(batch)), conn.dialect, conn.get_execution_options()
    )
    try:
        if not rows.advance_thread(view, commit, now):
            batch.cursor.execute("ROLLBACK")
            return None
        tid = commit.thread_id
        rows.insert_items(view, tid, commit.items)
        rows.upsert_calls(view, tid, commit.calls)
        rows.finish_rows(view, tid, commit.done, commit.rejected, commit.deferred, commit.trace)
        stmt = prepared(conn).insert_outbox
        fixed = {"created_at": now, "runs": 0, "trace": commit.trace}
        outbox = [{"thread_id": tid, "call_id": c, "action": a, **fixed} for c, a in commit.outbox]
        plan = plan_for(conn, stmt, outbox[0]) if outbox else None
        first_outbox = len(batch.kept)
        for params in outbox:
            assert plan is not None
            batch.kept.append(batch.bound(plan.sql, plan.bind(params)))
        rows.insert_timers(view, tid, commit.timers)
        rows.cancel_timers(view, tid, commit.cancel_timers)
        sql = ";".join([*batch.kept, "COMMIT"])
        cursor = batch.cursor
        try:
            cursor.execute(sql)
        except conn.dialect.loaded_dbapi.Error as exc:
            # Named, not quoted: the statements hold the turn's text, bound.
            what = f"the commit of thread {tid} after its guard ({len(batch.kept)} statements)"
            dbapi_error = conn.dialect.loaded_dbapi.Error
            raise DBAPIError.instance(what, None, exc, dbapi_error, dialect=conn.dialect) from exc
        created: list[OutboxRow] = []
        for index in range(len(batch.kept)):
            if plan is not None and first_outbox <= index < first_outbox + len(outbox):
                created += [outbox_row(plan.row(r)) for r in cursor.fetchall()]
            cursor.nextset()
        return sorted(created, key=lambda row: row.id)
    finally:
        batch.cursor.close()
