"""The SQL schema of the history store (DESIGN section 3), as SQLModel tables.

The columns are declared once, as SQLModel models (``ThreadColumns``...). ``schema(prefix)``
makes them tables named ``{prefix}threads``... in a registry and ``MetaData`` of their own,
built once per prefix: an application sharing the database (or another dormant deployment
with another ``DORMANT_TABLE_PREFIX``) never collides with them, and an application that
also uses SQLModel never sees dormant's tables in its own migrations. ``metadata`` is the
unprefixed schema. Constraint and index names come from a naming convention (explicit
names carry the prefix too), so the shipped migrations name them identically on SQLite
and PostgreSQL, where index names must be unique per database schema.

Item and message payloads are stored as the JSON their ``TypeAdapter`` produces: the stored
shape is the in-memory shape (STYLE rule 3). An item's JSON is stored packed (raw deflate
with the items' framing as its dictionary, ``stores/packing.py``), since PostgreSQL
compresses no row under 2 KB and SQLite none at all; items written before migration 0010
keep theirs as a JSON column.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import registry
from sqlalchemy.schema import SchemaItem
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

__all__ = [
    "CallColumns",
    "InboxColumns",
    "ItemColumns",
    "LedgerColumns",
    "OutboxColumns",
    "PrunedIdColumns",
    "Schema",
    "ThreadColumns",
    "TimerColumns",
    "UTCDateTime",
    "VersionChangeColumns",
    "WorkerColumns",
    "metadata",
    "schema",
]

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware timestamp that always goes in and comes out in UTC.

    SQLite has no time zones: it stores the wall-clock text and gives naive datetimes back,
    so every value is normalised to UTC on the way in (naive values are taken as UTC) and
    tagged UTC on the way out. PostgreSQL's ``timestamptz`` gets the same normalisation, so
    records never depend on the session's ``TimeZone``.
    """

    impl = DateTime
    cache_ok = True

    def __init__(self) -> None:
        super().__init__(timezone=True)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else as_utc(value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else as_utc(value)


def as_utc(value: datetime) -> datetime:
    """``value`` in UTC; a naive datetime is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class ThreadColumns(SQLModel):
    """One conversation; ``version`` fences every write (the commit's optimistic lock)."""

    id: str = Field(sa_type=String, primary_key=True)
    agent: str = Field(sa_type=String)
    parent_id: str | None = Field(default=None, sa_type=String, index=True)
    parent_call_id: str | None = Field(default=None, sa_type=String)
    fork_seq: int | None = Field(default=None, sa_type=Integer)
    root_id: str = Field(sa_type=String)
    status: str = Field(sa_type=String)
    version: int = Field(default=0, sa_type=Integer)
    failures: int = Field(default=0, sa_type=Integer)
    last_error: str = Field(default="", sa_type=Text)
    inbox_seen: int = Field(default=0, sa_type=BigInteger)
    retry_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    closed_reason: str = Field(default="", sa_type=Text)
    # "metadata" is reserved on declarative classes: the attribute is renamed, not the column.
    meta: dict[str, Any] = Field(
        default_factory=dict, sa_type=JSON, sa_column_kwargs={"name": "metadata"}
    )
    usage: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    created_at: datetime = Field(sa_type=UTCDateTime)
    updated_at: datetime = Field(sa_type=UTCDateTime)
    tree_tokens: int = Field(default=0, sa_type=BigInteger)
    """On a root: its whole tree's tokens, added to by each commit in the tree."""
    tree_cost_nanos: int = Field(default=0, sa_type=BigInteger)
    """Costs are kept in billionths (exact sums; a completion costs fractions of a cent)."""
    message_completions: int = Field(default=0, sa_type=Integer)
    code_version: str = Field(default="", sa_type=String)
    """The version of the agent that ran the last slice (migration 0011)."""
    source_id: str | None = Field(default=None, sa_type=String)
    """A fork's source thread (migration 0013): the history it inherits up to ``fork_seq``."""
    tag: str | None = Field(default=None, sa_type=String)
    """A replay's tag (migration 0013): its usage is summed apart."""


class ItemColumns(SQLModel):
    """One history entry; append-only. ``message_id`` is NULL for items with no message."""

    thread_id: str = Field(sa_type=String)
    seq: int = Field(sa_type=Integer)
    kind: str = Field(sa_type=String)
    data: dict[str, Any] | None = Field(default=None, sa_type=JSON(none_as_null=True))
    """The item's JSON, on rows written before migration 0010; NULL on later ones."""
    message_id: str | None = Field(default=None, sa_type=String)
    packed: bytes | None = Field(default=None, sa_type=LargeBinary)
    """The item's ``ItemAdapter.dump_json``, packed with ``ITEM_JSON_FRAMING``."""


class CallColumns(SQLModel):
    """Every tool call a thread made: routes results and events even after compaction."""

    thread_id: str = Field(sa_type=String)
    call_id: str = Field(sa_type=String)
    name: str = Field(sa_type=String)
    args: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    seq: int = Field(sa_type=Integer)
    state: str = Field(sa_type=String)
    subscription: bool = Field(default=False)
    passive: bool = Field(default=False)


class InboxColumns(SQLModel):
    """A thread's input queue; unique (thread_id, message_id) is the durable dedup."""

    id: int | None = Field(default=None, sa_type=BigId, primary_key=True)
    thread_id: str = Field(sa_type=String)
    message_id: str = Field(sa_type=String)
    kind: str = Field(sa_type=String)
    payload: dict[str, Any] = Field(sa_type=JSON)
    priority: int = Field(sa_type=Integer)
    state: str = Field(sa_type=String)
    reason: str = Field(default="", sa_type=Text)
    created_at: datetime = Field(sa_type=UTCDateTime)
    trace: str = Field(default="", sa_type=String, sa_column_kwargs={"server_default": ""})
    """The sender's trace context (``dormant.tracing.carrier``; migration 0014)."""


class OutboxColumns(SQLModel):
    """Tool calls to dispatch, written with the turn that made them."""

    id: int | None = Field(default=None, sa_type=BigId, primary_key=True)
    thread_id: str = Field(sa_type=String)
    call_id: str = Field(sa_type=String)
    action: str = Field(sa_type=String)
    created_at: datetime = Field(sa_type=UTCDateTime)
    dispatched_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    ran_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    claimed_until: datetime | None = Field(default=None, sa_type=UTCDateTime)
    """Set by the run that started the row and renewed while it runs (its heartbeat): a
    run whose claim lapsed died, and the sweeper sends the row again."""
    runs: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    """Claims taken on the row: the runs started, the last of which may still be live."""
    trace: str = Field(default="", sa_type=String, sa_column_kwargs={"server_default": ""})
    """The trace context of the slice that wrote the row (migration 0014)."""


class TimerColumns(SQLModel):
    """A message to enqueue at ``due_at``, under a stable ``message_id``."""

    id: int | None = Field(default=None, sa_type=BigId, primary_key=True)
    thread_id: str = Field(sa_type=String)
    call_id: str = Field(sa_type=String)
    due_at: datetime = Field(sa_type=UTCDateTime)
    message_id: str = Field(sa_type=String)
    message: dict[str, Any] = Field(sa_type=JSON)
    fired_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class PrunedIdColumns(SQLModel):
    """A message id retention pruned from a live thread's inbox that left no item in its
    history, as an 8-byte digest (``stores/digest.py``): it stays a duplicate while the
    thread lives, and goes with it."""

    thread_id: str = Field(sa_type=String)
    digest: bytes = Field(sa_type=LargeBinary)


class LedgerColumns(SQLModel):
    """What a thread's model calls used in one minute (``at``, its start): each commit adds
    its slice's usage to its minute's row; ``dormant usage`` sums these rows."""

    thread_id: str = Field(sa_type=String)
    at: datetime = Field(sa_type=UTCDateTime)
    completions: int = Field(default=0, sa_type=Integer)
    input_tokens: int = Field(default=0, sa_type=BigInteger)
    output_tokens: int = Field(default=0, sa_type=BigInteger)
    cached_tokens: int = Field(default=0, sa_type=BigInteger)
    cost_nanos: int = Field(default=0, sa_type=BigInteger)


class WorkerColumns(SQLModel):
    """A process that runs agents, as it last announced itself (``WorkerCard``)."""

    id: str = Field(sa_type=String, primary_key=True)
    host: str = Field(sa_type=String)
    agents: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    """``{agent: {"version": str, "tools": [names]}}``."""
    started_at: datetime = Field(sa_type=UTCDateTime)
    seen_at: datetime = Field(sa_type=UTCDateTime)


class VersionChangeColumns(SQLModel):
    """A deploy met the thread: its slices from ``from_seq`` on ran ``code_version``, the
    ones before ran ``previous`` (migration 0012). A thread one version ran has no row."""

    thread_id: str = Field(sa_type=String)
    from_seq: int = Field(sa_type=Integer)
    code_version: str = Field(sa_type=String)
    previous: str = Field(sa_type=String)
    at: datetime = Field(sa_type=UTCDateTime)


# The tables, per prefix ----------------------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """dormant's tables under one prefix, in a ``MetaData`` of their own."""

    prefix: str
    metadata: MetaData
    threads: Table
    items: Table
    calls: Table
    inbox: Table
    outbox: Table
    timers: Table
    pruned_ids: Table
    ledger: Table
    workers: Table
    version_changes: Table


@functools.cache
def schema(prefix: str = "") -> Schema:
    """The tables named ``{prefix}threads``...; built once per prefix (``Table`` objects
    belong to one ``MetaData``, so each prefix needs its own)."""
    md = MetaData(naming_convention=NAMING_CONVENTION)
    base = types.new_class("_Table", (SQLModel,), {"registry": registry(metadata=md)})

    def table(columns: type[SQLModel], name: str, *args: SchemaItem | dict[str, Any]) -> Table:
        body = {"__tablename__": prefix + name, "__table_args__": args}
        types.new_class(
            f"{name.title()}Table", (columns, base), {"table": True}, lambda ns: ns.update(body)
        )
        return md.tables[prefix + name]

    def thread_fk() -> ForeignKeyConstraint:
        return ForeignKeyConstraint(["thread_id"], [f"{prefix}threads.id"])

    def partial(name: str, *columns: str, where: str) -> Index:
        clause = text(where)
        return Index(f"ix_{prefix}{name}", *columns, postgresql_where=clause, sqlite_where=clause)

    # AUTOINCREMENT on SQLite: ids never go back, even after the newest row is deleted.
    autoincrement = {"sqlite_autoincrement": True}
    return Schema(
        prefix=prefix,
        metadata=md,
        threads=table(
            ThreadColumns,
            "threads",
            Index(None, "created_at", "id"),
            Index(None, "status", "created_at", "id"),  # one status, newest first
            Index(None, "root_id"),
            Index(None, "source_id"),  # retention keeps a source while a fork reads it
            partial("threads_closed", "updated_at", where="status = 'closed'"),
            # the idle sweep's order, ``id`` included: a LIMIT stops after its rows even
            # among threads idle since the same instant (migration 0009)
            partial("threads_idle", "agent", "updated_at", "id", where="status = 'idle'"),
            # a replay tag's threads, newest first (migration 0015): replays only
            partial("threads_tagged", "tag", "created_at", "id", where="tag IS NOT NULL"),
        ),
        items=table(
            ItemColumns,
            "items",
            PrimaryKeyConstraint("thread_id", "seq"),
            UniqueConstraint("thread_id", "message_id"),
            thread_fk(),
        ),
        calls=table(
            CallColumns, "calls", PrimaryKeyConstraint("thread_id", "call_id"), thread_fk()
        ),
        inbox=table(
            InboxColumns,
            "inbox",
            UniqueConstraint("thread_id", "message_id"),
            thread_fk(),
            partial("inbox_pending", "thread_id", "id", where="state = 'pending'"),
            partial("inbox_quarantined", "id", where="state = 'quarantined'"),
            autoincrement,
        ),
        outbox=table(
            OutboxColumns,
            "outbox",
            thread_fk(),
            partial("outbox_undispatched", "created_at", where="dispatched_at IS NULL"),
            partial("outbox_unran", "dispatched_at", where="ran_at IS NULL"),
            partial("outbox_claimed", "claimed_until", where="ran_at IS NULL"),
            autoincrement,
        ),
        timers=table(
            TimerColumns,
            "timers",
            UniqueConstraint("thread_id", "message_id"),
            thread_fk(),
            partial("timers_unfired", "due_at", where="fired_at IS NULL"),
            autoincrement,
        ),
        pruned_ids=table(
            PrunedIdColumns,
            "pruned_ids",
            PrimaryKeyConstraint("thread_id", "digest"),
            thread_fk(),
        ),
        ledger=table(
            LedgerColumns,
            "ledger",
            PrimaryKeyConstraint("thread_id", "at"),
            thread_fk(),
            Index(None, "at"),
        ),
        workers=table(WorkerColumns, "workers"),
        version_changes=table(
            VersionChangeColumns,
            "version_changes",
            PrimaryKeyConstraint("thread_id", "from_seq"),
            thread_fk(),
        ),
    )


metadata = schema("").metadata
"""dormant's unprefixed schema, separate from any application's SQLModel tables."""
