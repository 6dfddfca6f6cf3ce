"""The SQL store's statements, run on the connection and transaction ``sql.py`` opens.

Each writes many rows in one statement where it can (items, calls, inbox fates, outbox), so
a slice's commit costs a handful of round trips whatever its size.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, case, select, update

from dormant.errors import (
    CallAnswered,
    DuplicateMessage,
    SubscriptionCancelled,
    ThreadClosed,
    UnknownCall,
    UnknownThread,
)
from dormant.messages import Inbound, UserMessage
from dormant.stores.base import (
    CallRecord,
    CallState,
    Commit,
    InboxRow,
    InboxState,
    NewThread,
    NewTimer,
    OutboxRow,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
)
from dormant.stores.sql_rows import (
    call_values,
    inbox_row,
    inbox_values,
    insert_for,
    is_open,
    item_values,
    outbox_row,
    stored_item,
    tables,
    thread_info,
    thread_values,
    timer_values,
)

__all__ = [
    "ConnectionReader",
    "advance_thread",
    "cancel_timers",
    "check_inbound",
    "children",
    "claim_timer",
    "close_descendants",
    "create_thread",
    "enqueue_elsewhere",
    "finish_rows",
    "get_thread",
    "insert_inbox_ignoring_duplicates",
    "insert_items",
    "insert_outbox",
    "insert_timers",
    "own_items",
    "upsert_calls",
]


def get_thread(conn: Connection, thread_id: str, *, share: bool = False) -> ThreadInfo:
    """The thread or ``UnknownThread``; ``share`` holds off concurrent commits to it."""
    threads = tables(conn).threads
    query = select(threads).where(threads.c.id == thread_id)
    if share:
        query = query.with_for_update(read=True)
    row = conn.execute(query).mappings().first()
    if row is None:
        raise UnknownThread(thread_id)
    return thread_info(row)


def create_thread(conn: Connection, thread: NewThread, now: datetime) -> ThreadInfo:
    """Insert a thread; the primary key, not a prior read, decides that it is new."""
    t = tables(conn)
    threads, items = t.threads, t.items
    stmt = (
        insert_for(conn, threads)
        .values(thread_values(thread, now))
        .on_conflict_do_nothing(index_elements=["id"])
        .returning(*threads.c)
    )
    row = conn.execute(stmt).mappings().first()
    if row is None:
        raise DuplicateMessage(thread.id, thread.id)
    if thread.items:
        conn.execute(items.insert().values([item_values(thread.id, s) for s in thread.items]))
    upsert_calls(conn, thread.id, thread.calls)
    if thread.messages:
        first = [inbox_values(thread.id, mid, m, p, now) for mid, m, p in thread.messages]
        conn.execute(tables(conn).inbox.insert().values(first))
    return thread_info(row)


def insert_inbox_ignoring_duplicates(conn: Connection, values: dict[str, Any]) -> InboxRow | None:
    """The new row, or None when the thread already received that message id."""
    inbox = tables(conn).inbox
    stmt = (
        insert_for(conn, inbox)
        .values(values)
        .on_conflict_do_nothing(index_elements=["thread_id", "message_id"])
        .returning(*inbox.c)
    )
    row = conn.execute(stmt).mappings().first()
    return None if row is None else inbox_row(row)


def upsert_calls(conn: Connection, thread_id: str, records: list[CallRecord]) -> None:
    calls = tables(conn).calls
    if not records:
        return
    stmt = insert_for(conn, calls).values([call_values(thread_id, r) for r in records])
    changed = ("name", "args", "seq", "state", "subscription", "passive")
    stmt = stmt.on_conflict_do_update(
        index_elements=["thread_id", "call_id"],
        set_={name: stmt.excluded[name] for name in changed},
    )
    conn.execute(stmt)


def insert_items(conn: Connection, thread_id: str, stored: list[StoredItem]) -> None:
    if stored:
        items = tables(conn).items
        conn.execute(items.insert().values([item_values(thread_id, s) for s in stored]))


def finish_rows(
    conn: Connection,
    thread_id: str,
    done: list[int],
    rejected: list[tuple[int, str]],
    deferred: list[int],
) -> None:
    """Mark a slice's inbox rows done, rejected or deferred, in one statement; finished rows
    stay as they are. Only a rejection writes a reason: a done or deferred row keeps its own
    (a row retried after quarantine stays marked ``RETRIED_MARK``)."""
    inbox = tables(conn).inbox
    states = {row_id: InboxState.DONE.value for row_id in done}
    states |= {row_id: InboxState.DEFERRED.value for row_id in deferred}
    states |= {row_id: InboxState.REJECTED.value for row_id, _ in rejected}
    if not states:
        return
    new_state: Any = (
        next(iter(states.values())) if len(states) == 1 else case(states, value=inbox.c.id)
    )
    reasons = dict(rejected)
    new_reason: Any = (
        case(reasons, value=inbox.c.id, else_=inbox.c.reason) if reasons else inbox.c.reason
    )
    conn.execute(
        update(inbox)
        .where(inbox.c.id.in_(list(states)), inbox.c.thread_id == thread_id, is_open(inbox))
        .values(state=new_state, reason=new_reason)
    )


def insert_outbox(
    conn: Connection, entries: list[tuple[str, str, str]], now: datetime
) -> list[OutboxRow]:
    """Insert (thread_id, call_id, action) outbox rows in one statement, in that order."""
    if not entries:
        return []
    outbox = tables(conn).outbox
    values = [{"thread_id": t, "call_id": c, "action": a, "created_at": now} for t, c, a in entries]
    found = conn.execute(outbox.insert().values(values).returning(*outbox.c)).mappings()
    return sorted((outbox_row(r) for r in found), key=lambda row: row.id)


def insert_timers(conn: Connection, thread_id: str, new: list[NewTimer]) -> None:
    """Insert timers; one whose (thread_id, message_id) exists already is ignored."""
    timers = tables(conn).timers
    if new:
        stmt = insert_for(conn, timers).on_conflict_do_nothing(
            index_elements=["thread_id", "message_id"]
        )
        conn.execute(stmt, [timer_values(thread_id, t) for t in new])


def cancel_timers(conn: Connection, thread_id: str, call_ids: list[str]) -> None:
    timers = tables(conn).timers
    if call_ids:
        conn.execute(
            timers.delete().where(
                timers.c.thread_id == thread_id,
                timers.c.call_id.in_(call_ids),
                timers.c.fired_at.is_(None),
            )
        )


def claim_timer(conn: Connection, timer_id: int, now: datetime) -> bool:
    """Set ``fired_at`` unless another sweeper already did: the claim is the UPDATE."""
    timers = tables(conn).timers
    stmt = (
        update(timers)
        .where(timers.c.id == timer_id, timers.c.fired_at.is_(None))
        .values(fired_at=now)
    )
    return conn.execute(stmt).rowcount == 1


def enqueue_elsewhere(
    conn: Connection, entries: list[tuple[str, str, Inbound, int]], now: datetime
) -> None:
    """Queue a commit's messages for other threads; duplicates and unknown targets are
    skipped (threads are never deleted, so reading the targets first is race-free)."""
    if not entries:
        return
    threads = tables(conn).threads
    targets = {thread_id for thread_id, *_ in entries}
    known = set(conn.execute(select(threads.c.id).where(threads.c.id.in_(targets))).scalars())
    for thread_id, message_id, message, priority in entries:
        if thread_id in known:
            values = inbox_values(thread_id, message_id, message, priority, now)
            insert_inbox_ignoring_duplicates(conn, values)


def check_inbound(
    conn: Connection, thread_id: str, message_id: str, message: Inbound, *, answered_ok: bool
) -> None:
    """Refuse a message the thread can never accept (the sender sees why). Unless
    ``answered_ok``, a result for a call that has its result (not a subscription) is refused:
    ``DuplicateMessage`` if it is that result again, else ``CallAnswered``."""
    t = tables(conn)
    threads, calls, inbox = t.threads, t.calls, t.inbox
    if isinstance(message, UserMessage):
        if get_thread(conn, thread_id, share=True).status is ThreadStatus.CLOSED:
            raise ThreadClosed(thread_id)
        return
    # The thread (locked against a concurrent close) and the call, in one round trip.
    its_call = and_(calls.c.thread_id == threads.c.id, calls.c.call_id == message.call_id)
    query = (
        select(threads.c.status, calls.c.state, calls.c.subscription)
        .select_from(threads.outerjoin(calls, its_call))
        .where(threads.c.id == thread_id)
        .with_for_update(read=True, of=threads)
    )
    found = conn.execute(query).first()
    if found is None:
        raise UnknownThread(thread_id)
    status, state, subscription = found
    if status == ThreadStatus.CLOSED.value:
        raise ThreadClosed(thread_id)
    if state is None:
        raise UnknownCall(thread_id, message.call_id)
    if state == CallState.CANCELLED.value:
        raise SubscriptionCancelled(thread_id, message.call_id)
    if answered_ok or state != CallState.ANSWERED.value or subscription:
        return
    mine = (inbox.c.thread_id == thread_id, inbox.c.message_id == message_id)
    if conn.execute(select(inbox.c.id).where(*mine)).first() is not None:
        raise DuplicateMessage(thread_id, message_id)
    raise CallAnswered(thread_id, message.call_id, message_id)


def advance_thread(conn: Connection, commit: Commit, now: datetime) -> bool:
    """The version guard and the thread's new state, in one statement."""
    threads = tables(conn).threads
    seen = threads.c.inbox_seen
    values: dict[str, Any] = {
        "version": threads.c.version + 1,
        "status": commit.status.value,
        "inbox_seen": case((seen > commit.inbox_seen, seen), else_=commit.inbox_seen),
        "failures": 0,
        "last_error": "",
        "retry_at": None,
        "updated_at": now,
    }
    if commit.usage is not None:
        values["usage"] = commit.usage.model_dump(mode="json")
    stmt = (
        update(threads)
        .where(threads.c.id == commit.thread_id, threads.c.version == commit.version)
        .values(values)
    )
    return conn.execute(stmt).rowcount == 1


# Lineage: inheritance and closing a subtree ------------------------------------------


class ConnectionReader:
    """``lineage.OwnItems`` on one open connection: a history is read in one snapshot."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def thread(self, thread_id: str) -> ThreadInfo:
        return get_thread(self._conn, thread_id)

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
        return own_items(self._conn, thread_id, upto_seq)


def own_items(conn: Connection, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
    items = tables(conn).items
    query = select(items).where(items.c.thread_id == thread_id).order_by(items.c.seq)
    if upto_seq is not None:
        query = query.where(items.c.seq <= upto_seq)
    return [stored_item(r) for r in conn.execute(query).mappings()]


def children(conn: Connection, thread_id: str) -> list[ThreadInfo]:
    """Direct children, oldest first."""
    threads = tables(conn).threads
    query = (
        select(threads)
        .where(threads.c.parent_id == thread_id)
        .order_by(threads.c.created_at, threads.c.id)
    )
    return [thread_info(r) for r in conn.execute(query).mappings()]


def close_descendants(conn: Connection, thread_id: str, now: datetime) -> list[OutboxRow]:
    """Close every open descendant (depth first, oldest child first), cancelling their live
    subscriptions; the "cancel" outbox rows let the tools' hooks stop their streams."""
    threads = tables(conn).threads
    cancelled: list[OutboxRow] = []
    for child in children(conn, thread_id):
        if child.status is not ThreadStatus.CLOSED:
            cancelled += _cancel_subscriptions(conn, child.id, now)
            conn.execute(
                update(threads)
                .where(threads.c.id == child.id)
                .values(
                    status=ThreadStatus.CLOSED.value,
                    version=threads.c.version + 1,
                    updated_at=now,
                )
            )
        cancelled += close_descendants(conn, child.id, now)
    return cancelled


def _cancel_subscriptions(conn: Connection, thread_id: str, now: datetime) -> list[OutboxRow]:
    calls = tables(conn).calls
    live = (CallState.PENDING.value, CallState.SUBSCRIBED.value)
    mine = (calls.c.thread_id == thread_id, calls.c.subscription.is_(True))
    call_ids = list(
        conn.execute(
            select(calls.c.call_id)
            .where(*mine, calls.c.state.in_(live))
            .order_by(calls.c.seq, calls.c.call_id)
        ).scalars()
    )
    if call_ids:
        conn.execute(
            update(calls)
            .where(*mine, calls.c.call_id.in_(call_ids))
            .values(state=CallState.CANCELLED.value)
        )
    return insert_outbox(conn, [(thread_id, call_id, "cancel") for call_id in call_ids], now)
