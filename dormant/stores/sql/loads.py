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
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from sqlalchemy import Connection

from dormant.errors import UnknownThread
from dormant.stores.base import Snapshot, StoredItem, ThreadInfo
from dormant.stores.lineage import inherits_from, next_seq, visible_history
from dormant.stores.sql.direct import Found, plan_for, translated
from dormant.stores.sql.items import ItemCache
from dormant.stores.sql.prepared import prepared
from dormant.stores.sql.rows import call_record, inbox_row, stored_item, thread_info

__all__ = ["OneTripLoads"]

_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
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
    """Run the read-only ``statements`` in one snapshot, as one query: one round trip."""
    from psycopg import ClientCursor
    from psycopg.pq import ExecStatus

    plans = [(plan_for(conn, stmt, params), params) for stmt, params in statements]
    values: dict[str, Any] = {}
    for plan, params in plans:
        for name, value in plan.bind(params).items():
            if values.setdefault(name, value) != value:
                raise ValueError(f"two statements bind {name!r} to different values")
    sql = ";".join([_BEGIN, *(plan.sql for plan, _ in plans), "COMMIT"])
    raw: Any = conn.connection.dbapi_connection
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
