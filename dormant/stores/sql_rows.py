"""Row-level SQL for the store: records (base.py) to rows (tables.py) and back, and the
statements that write them inside a transaction ``sql.py`` opens.

Items and messages go through their one ``TypeAdapter`` both ways: the JSON column holds
exactly what ``dump_python(mode="json")`` produced.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, Table, case, literal_column, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from dormant.errors import (
    DuplicateMessage,
    SubscriptionCancelled,
    ThreadClosed,
    UnknownCall,
    UnknownThread,
)
from dormant.messages import Inbound, InboundAdapter, ItemAdapter, Usage, UserMessage
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
from dormant.stores.tables import Schema, schema

__all__ = [
    "SCHEMA_OPTION",
    "advance_thread",
    "call_record",
    "cancel_timers",
    "check_inbound",
    "children",
    "claim_timer",
    "close_descendants",
    "create_thread",
    "enqueue_elsewhere",
    "finish_rows",
    "get_thread",
    "inbox_row",
    "inbox_values",
    "insert_for",
    "insert_inbox_ignoring_duplicates",
    "insert_outbox",
    "insert_timers",
    "is_open",
    "is_pending",
    "is_unique_violation",
    "item_values",
    "outbox_row",
    "own_items",
    "stored_item",
    "tables",
    "thread_info",
    "upsert_calls",
]

Row = RowMapping

SCHEMA_OPTION = "dormant_schema"
"""The execution option naming the ``Schema`` (table prefix) of a connection's store."""


def tables(conn: Connection) -> Schema:
    """The tables of the store that opened ``conn``: ``SQLStore`` sets them on every
    connection (as SQLAlchemy's ``schema_translate_map`` travels), so every statement here
    honours ``DORMANT_TABLE_PREFIX``. A connection without the option gets no prefix."""
    found: Schema | None = conn.get_execution_options().get(SCHEMA_OPTION)
    return found if found is not None else schema("")


def is_pending(inbox: Table) -> Any:
    """Written as a literal, not a bound parameter, so the partial index ``ix_inbox_pending``
    stays usable by prepared (generic) plans."""
    return inbox.c.state == literal_column(f"'{InboxState.PENDING.value}'")


def is_open(inbox: Table) -> Any:
    """Rows a slice still has to decide on: pending, or deferred by an earlier slice."""
    return inbox.c.state.in_([InboxState.PENDING.value, InboxState.DEFERRED.value])


def thread_values(thread: NewThread, now: datetime) -> dict[str, Any]:
    """A new thread: idle, version 0, its own root unless it names one."""
    return {
        "id": thread.id,
        "agent": thread.agent,
        "parent_id": thread.parent_id,
        "parent_call_id": thread.parent_call_id,
        "fork_seq": thread.fork_seq,
        "root_id": thread.root_id or thread.id,
        "status": ThreadStatus.IDLE.value,
        "version": 0,
        "failures": 0,
        "last_error": "",
        "retry_at": None,
        "inbox_seen": 0,
        "metadata": dict(thread.metadata),
        "usage": Usage().model_dump(mode="json"),
        "created_at": now,
        "updated_at": now,
    }


def thread_info(row: Row) -> ThreadInfo:
    return ThreadInfo(
        id=row["id"],
        agent=row["agent"],
        status=ThreadStatus(row["status"]),
        version=row["version"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        parent_id=row["parent_id"],
        parent_call_id=row["parent_call_id"],
        fork_seq=row["fork_seq"],
        root_id=row["root_id"],
        metadata=dict(row["metadata"]),
        usage=Usage.model_validate(row["usage"]),
        failures=row["failures"],
        last_error=row["last_error"],
        inbox_seen=row["inbox_seen"],
        retry_at=row["retry_at"],
    )


def item_values(thread_id: str, stored: StoredItem) -> dict[str, Any]:
    """An item row; an empty message id becomes NULL so the unique key ignores it."""
    return {
        "thread_id": thread_id,
        "seq": stored.seq,
        "kind": stored.item.kind,
        "data": ItemAdapter.dump_python(stored.item, mode="json"),
        "message_id": stored.message_id or None,
    }


def stored_item(row: Row) -> StoredItem:
    return StoredItem(
        seq=row["seq"],
        message_id=row["message_id"] or "",
        item=ItemAdapter.validate_python(row["data"]),
    )


def call_values(thread_id: str, call: CallRecord) -> dict[str, Any]:
    return {
        "thread_id": thread_id,
        "call_id": call.call_id,
        "name": call.name,
        "args": call.args,
        "seq": call.seq,
        "state": call.state.value,
        "subscription": call.subscription,
        "passive": call.passive,
    }


def call_record(row: Row) -> CallRecord:
    return CallRecord(
        call_id=row["call_id"],
        name=row["name"],
        args=dict(row["args"]),
        seq=row["seq"],
        state=CallState(row["state"]),
        subscription=row["subscription"],
        passive=row["passive"],
    )


def inbox_values(
    thread_id: str, message_id: str, message: Inbound, priority: int, now: datetime
) -> dict[str, Any]:
    return {
        "thread_id": thread_id,
        "message_id": message_id,
        "kind": message.kind,
        "payload": InboundAdapter.dump_python(message, mode="json"),
        "priority": int(priority),
        "state": InboxState.PENDING.value,
        "reason": "",
        "created_at": now,
    }


def inbox_row(row: Row) -> InboxRow:
    return InboxRow(
        id=row["id"],
        thread_id=row["thread_id"],
        message_id=row["message_id"],
        message=InboundAdapter.validate_python(row["payload"]),
        priority=row["priority"],
        state=InboxState(row["state"]),
        created_at=row["created_at"],
        reason=row["reason"],
    )


def outbox_row(row: Row) -> OutboxRow:
    return OutboxRow(
        id=row["id"],
        thread_id=row["thread_id"],
        call_id=row["call_id"],
        action=row["action"],
        created_at=row["created_at"],
        dispatched_at=row["dispatched_at"],
        ran_at=row["ran_at"],
    )


def timer_values(thread_id: str, timer: NewTimer) -> dict[str, Any]:
    return {
        "thread_id": thread_id,
        "call_id": timer.call_id,
        "due_at": timer.due_at,
        "message_id": timer.message_id,
        "message": InboundAdapter.dump_python(timer.message, mode="json"),
    }


# Statements, run on the caller's connection and transaction -------------------------


def insert_for(conn: Connection, table: Table) -> postgresql.Insert | sqlite.Insert:
    """The dialect's insert: both speak ``ON CONFLICT``."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


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
        conn.execute(items.insert(), [item_values(thread.id, s) for s in thread.items])
    upsert_calls(conn, thread.id, thread.calls)
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
    stmt = insert_for(conn, calls)
    changed = ("name", "args", "seq", "state", "subscription", "passive")
    stmt = stmt.on_conflict_do_update(
        index_elements=["thread_id", "call_id"],
        set_={name: stmt.excluded[name] for name in changed},
    )
    conn.execute(stmt, [call_values(thread_id, r) for r in records])


def finish_rows(
    conn: Connection,
    thread_id: str,
    done: list[int],
    rejected: list[tuple[int, str]],
    deferred: list[int],
) -> None:
    """Mark a slice's inbox rows done, rejected or deferred; finished rows stay as they are."""
    inbox = tables(conn).inbox
    mine = (inbox.c.thread_id == thread_id, is_open(inbox))
    if deferred:
        conn.execute(
            update(inbox)
            .where(inbox.c.id.in_(deferred), *mine)
            .values(state=InboxState.DEFERRED.value)
        )
    if done:
        conn.execute(
            update(inbox).where(inbox.c.id.in_(done), *mine).values(state=InboxState.DONE.value)
        )
    for row_id, reason in rejected:
        conn.execute(
            update(inbox)
            .where(inbox.c.id == row_id, *mine)
            .values(state=InboxState.REJECTED.value, reason=reason)
        )


def insert_outbox(
    conn: Connection, thread_id: str, call_id: str, action: str, now: datetime
) -> OutboxRow:
    outbox = tables(conn).outbox
    values = {"thread_id": thread_id, "call_id": call_id, "action": action, "created_at": now}
    row = conn.execute(outbox.insert().values(values).returning(*outbox.c))
    return outbox_row(row.mappings().one())


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


def check_inbound(conn: Connection, thread_id: str, message: Inbound) -> None:
    """Refuse a message the thread can never accept (the sender sees why)."""
    calls = tables(conn).calls
    if get_thread(conn, thread_id, share=True).status is ThreadStatus.CLOSED:
        raise ThreadClosed(thread_id)
    if isinstance(message, UserMessage):
        return
    state = conn.execute(
        select(calls.c.state).where(
            calls.c.thread_id == thread_id, calls.c.call_id == message.call_id
        )
    ).scalar_one_or_none()
    if state is None:
        raise UnknownCall(thread_id, message.call_id)
    if state == CallState.CANCELLED.value:
        raise SubscriptionCancelled(thread_id, message.call_id)


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


def is_unique_violation(exc: IntegrityError) -> bool:
    """Whether the error is a duplicate key (not, say, a foreign key or NOT NULL failure)."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == "23505":  # psycopg: unique_violation
        return True
    return getattr(orig, "sqlite_errorname", "") in (
        "SQLITE_CONSTRAINT_UNIQUE",
        "SQLITE_CONSTRAINT_PRIMARYKEY",
    )


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
    return [insert_outbox(conn, thread_id, call_id, "cancel", now) for call_id in call_ids]
