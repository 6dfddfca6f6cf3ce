"""Records (base.py) to rows (tables.py) and back, for the SQL store; the statements that
read and write them are in ``statements.py``.

Items and messages go through their one ``TypeAdapter`` both ways. A message's JSON column
holds exactly what ``dump_python(mode="json")`` produced; an item's ``packed`` column holds
its ``dump_json``, packed (``stores/packing.py``), and reads back as a ``RawStoredItem``
that decodes the item only when something reads it (``stores/rawitem.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, literal_column
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from dormant.messages import Inbound, InboundAdapter, ItemAdapter, Usage
from dormant.stores.base import (
    CallRecord,
    CallState,
    InboxRow,
    InboxState,
    NewThread,
    NewTimer,
    OutboxRow,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
)
from dormant.stores.packing import ITEM_JSON_FRAMING, pack, unpack
from dormant.stores.rawitem import RawStoredItem, item_json, item_kind
from dormant.stores.sql.tables import Schema, as_utc, schema

__all__ = [
    "NANOS",
    "SCHEMA_OPTION",
    "call_record",
    "call_values",
    "from_nanos",
    "inbox_row",
    "inbox_values",
    "insert_for",
    "is_open",
    "is_pending",
    "is_unique_violation",
    "item_values",
    "outbox_row",
    "stored_item",
    "tables",
    "thread_info",
    "thread_values",
    "timer_values",
    "to_nanos",
]

Row = Mapping[Any, Any]
"""A row by column name: SQLAlchemy's ``RowMapping`` or ``direct.py``'s dict."""

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
        "source_id": thread.source_id,
        "tag": thread.tag,
        "status": thread.status.value,
        "version": 0,
        "failures": 0,
        "last_error": "",
        "retry_at": None if thread.retry_at is None else as_utc(thread.retry_at),
        "closed_reason": "",
        "inbox_seen": 0,
        "metadata": dict(thread.metadata),
        "usage": Usage().model_dump(mode="json"),
        "created_at": now,
        "updated_at": now,
        "tree_tokens": 0,
        "tree_cost_nanos": 0,
        "message_completions": 0,
        "code_version": "",
    }


NANOS = 1_000_000_000
"""Costs are stored in billionths of the price table's currency, as integers."""


def to_nanos(cost: float) -> int:
    return round(cost * NANOS)


def from_nanos(cost_nanos: int) -> float:
    return cost_nanos / NANOS


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
        closed_reason=row["closed_reason"],
        tree_tokens=row["tree_tokens"],
        tree_cost=from_nanos(row["tree_cost_nanos"]),
        message_completions=row["message_completions"],
        code_version=row["code_version"],
        source_id=row["source_id"],
        tag=row["tag"],
    )


def item_values(thread_id: str, stored: StoredItem) -> dict[str, Any]:
    """An item row; an empty message id becomes NULL so the unique key ignores it."""
    return {
        "thread_id": thread_id,
        "seq": stored.seq,
        "kind": item_kind(stored),
        "packed": pack(item_json(stored), ITEM_JSON_FRAMING),
        "message_id": stored.message_id or None,
    }


def stored_item(row: Row) -> StoredItem:
    """The item of a row: undecoded from ``packed``, decoded from a row before 0010."""
    packed = row["packed"]
    message_id = row["message_id"] or ""
    if packed is None:
        return StoredItem(row["seq"], message_id, ItemAdapter.validate_python(row["data"]))
    return RawStoredItem(row["seq"], message_id, row["kind"], unpack(packed, ITEM_JSON_FRAMING))


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
    thread_id: str,
    message_id: str,
    message: Inbound,
    priority: int,
    now: datetime,
    trace: str = "",
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
        "trace": trace,
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
        trace=row["trace"] or "",
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
        claimed_until=row["claimed_until"],
        runs=row["runs"],
        trace=row["trace"] or "",
    )


def timer_values(thread_id: str, timer: NewTimer) -> dict[str, Any]:
    return {
        "thread_id": thread_id,
        "call_id": timer.call_id,
        "due_at": timer.due_at,
        "message_id": timer.message_id,
        "message": InboundAdapter.dump_python(timer.message, mode="json"),
    }


def insert_for(conn: Connection, table: Table) -> postgresql.Insert | sqlite.Insert:
    """The dialect's insert: both speak ``ON CONFLICT``."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def is_unique_violation(exc: IntegrityError) -> bool:
    """Whether the error is a duplicate key (not, say, a foreign key or NOT NULL failure)."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == "23505":  # psycopg: unique_violation
        return True
    return getattr(orig, "sqlite_errorname", "") in (
        "SQLITE_CONSTRAINT_UNIQUE",
        "SQLITE_CONSTRAINT_PRIMARYKEY",
    )
