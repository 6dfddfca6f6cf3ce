"""The SQL schema of the history store (DESIGN section 3), as SQLModel tables.

The tables live in their own registry and ``MetaData`` (``metadata`` below), not in the
global ``SQLModel.metadata``: an application that also uses SQLModel must not see dormant's
tables in its own migrations, nor dormant see theirs. Constraint names come from a naming
convention so the shipped migrations name them identically on SQLite and PostgreSQL.

Item and message payloads are stored as the JSON their ``TypeAdapter`` produces: the stored
shape is the in-memory shape (STYLE rule 3).
"""

from __future__ import annotations

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
    MetaData,
    PrimaryKeyConstraint,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import registry
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

__all__ = [
    "CallTable",
    "InboxTable",
    "ItemTable",
    "OutboxTable",
    "ThreadTable",
    "TimerTable",
    "UTCDateTime",
    "metadata",
]

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)
"""dormant's own schema, separate from any application's SQLModel tables."""


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


class _Table(SQLModel, registry=registry(metadata=metadata)):
    """The abstract base binding dormant's tables to ``metadata``."""


class ThreadTable(_Table, table=True):
    """One conversation; ``version`` fences every write (the commit's optimistic lock)."""

    __tablename__ = "threads"
    __table_args__ = (Index(None, "created_at", "id"),)

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
    # "metadata" is reserved on declarative classes: the attribute is renamed, not the column.
    meta: dict[str, Any] = Field(
        default_factory=dict, sa_type=JSON, sa_column_kwargs={"name": "metadata"}
    )
    usage: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    created_at: datetime = Field(sa_type=UTCDateTime)
    updated_at: datetime = Field(sa_type=UTCDateTime)


class ItemTable(_Table, table=True):
    """One history entry; append-only. ``message_id`` is NULL for items with no message."""

    __tablename__ = "items"
    __table_args__ = (
        PrimaryKeyConstraint("thread_id", "seq"),
        UniqueConstraint("thread_id", "message_id"),
        ForeignKeyConstraint(["thread_id"], ["threads.id"]),
    )

    thread_id: str = Field(sa_type=String)
    seq: int = Field(sa_type=Integer)
    kind: str = Field(sa_type=String)
    data: dict[str, Any] = Field(sa_type=JSON)
    message_id: str | None = Field(default=None, sa_type=String)


class CallTable(_Table, table=True):
    """Every tool call a thread made: routes results and events even after compaction."""

    __tablename__ = "calls"
    __table_args__ = (
        PrimaryKeyConstraint("thread_id", "call_id"),
        ForeignKeyConstraint(["thread_id"], ["threads.id"]),
    )

    thread_id: str = Field(sa_type=String)
    call_id: str = Field(sa_type=String)
    name: str = Field(sa_type=String)
    args: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    seq: int = Field(sa_type=Integer)
    state: str = Field(sa_type=String)
    subscription: bool = Field(default=False)
    passive: bool = Field(default=False)


class InboxTable(_Table, table=True):
    """A thread's input queue; unique (thread_id, message_id) is the durable dedup."""

    __tablename__ = "inbox"
    __table_args__ = (
        UniqueConstraint("thread_id", "message_id"),
        ForeignKeyConstraint(["thread_id"], ["threads.id"]),
        Index(
            "ix_inbox_pending",
            "thread_id",
            "id",
            postgresql_where=text("state = 'pending'"),
            sqlite_where=text("state = 'pending'"),
        ),
        # AUTOINCREMENT: ids never go back, even after the newest row is deleted.
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, sa_type=BigId, primary_key=True)
    thread_id: str = Field(sa_type=String)
    message_id: str = Field(sa_type=String)
    kind: str = Field(sa_type=String)
    payload: dict[str, Any] = Field(sa_type=JSON)
    priority: int = Field(sa_type=Integer)
    state: str = Field(sa_type=String)
    reason: str = Field(default="", sa_type=Text)
    created_at: datetime = Field(sa_type=UTCDateTime)


class OutboxTable(_Table, table=True):
    """Tool calls to dispatch, written with the turn that made them."""

    __tablename__ = "outbox"
    __table_args__ = (
        ForeignKeyConstraint(["thread_id"], ["threads.id"]),
        Index(
            "ix_outbox_undispatched",
            "created_at",
            postgresql_where=text("dispatched_at IS NULL"),
            sqlite_where=text("dispatched_at IS NULL"),
        ),
        Index(
            "ix_outbox_unran",
            "dispatched_at",
            postgresql_where=text("ran_at IS NULL"),
            sqlite_where=text("ran_at IS NULL"),
        ),
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, sa_type=BigId, primary_key=True)
    thread_id: str = Field(sa_type=String)
    call_id: str = Field(sa_type=String)
    action: str = Field(sa_type=String)
    created_at: datetime = Field(sa_type=UTCDateTime)
    dispatched_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    ran_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class TimerTable(_Table, table=True):
    """A message to enqueue at ``due_at``, under a stable ``message_id``."""

    __tablename__ = "timers"
    __table_args__ = (
        UniqueConstraint("thread_id", "message_id"),
        ForeignKeyConstraint(["thread_id"], ["threads.id"]),
        Index(
            "ix_timers_unfired",
            "due_at",
            postgresql_where=text("fired_at IS NULL"),
            sqlite_where=text("fired_at IS NULL"),
        ),
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, sa_type=BigId, primary_key=True)
    thread_id: str = Field(sa_type=String)
    call_id: str = Field(sa_type=String)
    due_at: datetime = Field(sa_type=UTCDateTime)
    message_id: str = Field(sa_type=String)
    message: dict[str, Any] = Field(sa_type=JSON)
    fired_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
