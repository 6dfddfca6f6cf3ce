"""A slice's load on PostgreSQL in one round trip: the thread, its new items, its calls and
its open inbox, read in one snapshot by one message to the server.

Read one at a time, they cost six round trips (``BEGIN`` at REPEATABLE READ, four
``SELECT``s, ``COMMIT``), on the path from a delivered message to its model call. Here the
same statements, with the transaction's begin and commit, go as one multi-statement query
with client-side binding (psycopg's ``ClientCursor``: the values are quoted by the driver,
the statements are the prepared ones of ``prepared.py``), and each one's rows are read
back in turn.

The items read depends on the thread's row only through the history cache (``items.py``):
it asks for the items after the cache's last one (``ItemCache.last_seq``), and they are
used if the row then shows the entry serves the snapshot (``ItemCache.known``). When it
does not (another slice replaced the entry meanwhile, the thread was re-created), or the
thread continues another's history (a child's, a fork's: their ancestors' items are read
after their row, in the same snapshot), the load reads as before (``store.py``); a thread
seen to have ancestors is remembered and read so from then on.

The four reads are prepared once on each connection (a ``PREPARE`` each, the first time
the connection reads them) and the load's query runs them by ``EXECUTE``: the server
parses and plans each statement of a simple query every time it is sent, and for these
four that was about two fifths of a load's 0.5 ms (docs/benchmarks.md, issue 35 part 2,
third pass). A connection that loses them (``DISCARD ALL``, a PgBouncer that pools by
transaction and runs the next query on another server connection) fails the ``EXECUTE``
with "prepared statement does not exist" (or, after a migration changed a table's
columns, "cached plan must not change result type"): that load is rolled back and read
again as text, and that connection reads as text from then on.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections import OrderedDict
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from dormant.errors import UnknownThread
from dormant.stores.base import Snapshot, StoredItem, ThreadInfo
from dormant.stores.lineage import inherits_from, next_seq, visible_history
from dormant.stores.sql.direct import Found, Plan, plan_for, translated
from dormant.stores.sql.items import ItemCache
from dormant.stores.sql.prepared import prepared
from dormant.stores.sql.rows import call_record, inbox_row, stored_item, thread_info

__all__ = ["OneTripLoads"]

_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_PREPARED = "dormant_prepared_loads"
"""A connection's ``info`` key: the names of the reads prepared on it, or None once it
lost one (it then reads as text)."""
_LOST = frozenset({"26000", "0A000"})
"""Why an ``EXECUTE`` of a read fails where its text would not: the statement is not
prepared on the server's session (invalid_sql_statement_name), or a migration changed the
columns it returns ("cached plan must not change result type")."""
_EXISTS = "42P05"
"""PostgreSQL's duplicate_prepared_statement."""
_PARAM = re.compile(r"%\((\w+)\)s")
_REMEMBERED = 10_000
"""Threads remembered as having ancestors (least recently seen out first)."""


class OneTripLoads:
    """Loads of root threads in one round trip; remembers which threads are not roots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inheriting: OrderedDict[str, None] = OrderedDict()

    def applies(self, thread_id: str) -> bool:
        """Whether ``thread_id`` is not known to continue another thread's history."""
        with self._lock:
            return thread_id not in self._inheriting

    def load(self, conn: Connection, thread_id: str, cache: ItemCache) -> Snapshot | None:
        """``Store.load`` on ``conn`` (a driver connection in autocommit), or None when the
        read cannot serve (the module docstring says when): the caller loads as before."""
        ready = prepared(conn)
        mine: dict[str, Any] = {"thread_id": thread_id}
        after = cache.last_seq(thread_id)
        items = (ready.own_items, mine)
        if after is not None:
            items = (ready.own_items_after, {**mine, "after": after})
        thread, fresh, calls, inbox = _read(
            conn,
            [(ready.get_thread, mine), items, (ready.calls_of, mine), (ready.open_inbox, mine)],
        )
        row = thread.first()
        if row is None:
            raise UnknownThread(thread_id)
        info = thread_info(row)
        if inherits_from(info) is not None:
            self._remember(thread_id)
            return None
        cached = cache.known(info)
        if (cached[-1].seq if cached else None) != after:
            return None
        own = cached + tuple(stored_item(r) for r in fresh.rows)
        cache.keep(info, own)
        history = visible_history(_Own(info, own), info)
        return Snapshot(
            thread=info,
            items=history,
            calls={r["call_id"]: call_record(r) for r in calls.rows},
            inbox=[inbox_row(r) for r in inbox.rows],
            next_seq=next_seq(info, history),
        )

    def _remember(self, thread_id: str) -> None:
        with self._lock:
            self._inheriting[thread_id] = None
            self._inheriting.move_to_end(thread_id)
            while len(self._inheriting) > _REMEMBERED:
                self._inheriting.popitem(last=False)


class _Own:
    """``lineage.OwnItems`` of a root thread whose items are read: it has no ancestors."""

    def __init__(self, info: ThreadInfo, items: tuple[StoredItem, ...]) -> None:
        self._info = info
        self._items = items

    def thread(self, thread_id: str) -> ThreadInfo:
        raise AssertionError(f"thread {self._info.id} has no ancestor to read ({thread_id})")

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
        assert thread_id == self._info.id and upto_seq is None
        return list(self._items)


def _read(conn: Connection, statements: list[tuple[Any, dict[str, Any]]]) -> list[Found]:
    """Run the read-only ``statements`` in one snapshot, as one query: one round trip
    (and one more for each statement the connection has not prepared yet)."""
    plans = [(plan_for(conn, stmt, params), params) for stmt, params in statements]
    values: dict[str, Any] = {}
    for plan, params in plans:
        for name, value in plan.bind(params).items():
            if values.setdefault(name, value) != value:
                raise ValueError(f"two statements bind {name!r} to different values")
    fairy: Any = conn.connection
    raw: Any = fairy.dbapi_connection
    ready: set[str] | None = fairy.info.setdefault(_PREPARED, set())
    if ready is None:
        return _query(conn, raw, plans, [plan.sql for plan, _ in plans], values)
    executes = [_prepare(conn, raw, plan, ready) for plan, _ in plans]
    try:
        return _query(conn, raw, plans, executes, values)
    except DBAPIError as error:
        if getattr(error.orig, "sqlstate", None) not in _LOST:
            raise
    raw.rollback()  # the failed EXECUTE left the query's transaction aborted
    fairy.info[_PREPARED] = None
    return _query(conn, raw, plans, [plan.sql for plan, _ in plans], values)


def _prepare(conn: Connection, raw: Any, plan: Plan, ready: set[str]) -> str:
    """``plan``'s ``EXECUTE`` on ``raw``, prepared there first if it is not yet."""
    name, prepare, execute = _prepared_forms(plan.sql)
    if name not in ready:
        try:
            raw.execute(prepare)
        except conn.dialect.loaded_dbapi.Error as exc:
            # Already there (a PgBouncer's server connection another client prepared it
            # on): the name is its text's digest, so it is this very statement.
            if getattr(exc, "sqlstate", None) != _EXISTS:
                raise translated(conn, plan, {}, exc) from exc
        ready.add(name)
    return execute


@functools.cache
def _prepared_forms(sql: str) -> tuple[str, str, str]:
    """The prepared name of ``sql`` (the same in every process), its ``PREPARE`` (the
    driver's placeholders numbered) and its ``EXECUTE`` (with the driver's placeholders)."""
    name = "dormant_load_" + hashlib.sha1(sql.encode(), usedforsecurity=False).hexdigest()[:16]
    params = list(dict.fromkeys(_PARAM.findall(sql)))
    body = sql
    for number, param in enumerate(params, start=1):
        body = body.replace(f"%({param})s", f"${number}")
    args = ", ".join(f"%({param})s" for param in params)
    execute = f"EXECUTE {name}({args})" if args else f"EXECUTE {name}"
    return name, f"PREPARE {name} AS {body.replace('%%', '%')}", execute


def _query(
    conn: Connection,
    raw: Any,
    plans: list[tuple[Plan, dict[str, Any]]],
    statements: list[str],
    values: dict[str, Any],
) -> list[Found]:
    from psycopg import ClientCursor
    from psycopg.pq import ExecStatus

    sql = ";".join([_BEGIN, *statements, "COMMIT"])
    cursor: Any = ClientCursor(raw)
    try:
        cursor.execute(sql, values)
        found: list[Found] = []
        while True:
            result = cursor.pgresult
            if result is not None and result.status == ExecStatus.TUPLES_OK:
                plan = plans[len(found)][0]
                found.append(Found([plan.row(r) for r in cursor.fetchall()], cursor.rowcount))
            if not cursor.nextset():
                break
        return found
    except conn.dialect.loaded_dbapi.Error as exc:
        raise translated(conn, plans[0][0], values, exc) from exc
    finally:
        cursor.close()
