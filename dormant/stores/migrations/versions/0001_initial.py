"""The initial schema: threads, items, calls, inbox, outbox, timers.

Compaction summaries are items (kind ``summary``) at their own position, so they need
no table of their own.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_AT = sa.DateTime(timezone=True)


def _thread_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["thread_id"], ["threads.id"], name=f"fk_{table}_thread_id_threads"
    )


def _partial(name: str, table: str, columns: list[str], where: str) -> None:
    op.create_index(
        name,
        table,
        columns,
        postgresql_where=sa.text(where),
        sqlite_where=sa.text(where),
    )


def upgrade() -> None:
    op.create_table(
        "threads",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("agent", sa.String(), nullable=False),
        sa.Column("parent_id", sa.String(), nullable=True),
        sa.Column("parent_call_id", sa.String(), nullable=True),
        sa.Column("fork_seq", sa.Integer(), nullable=True),
        sa.Column("root_id", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("inbox_seen", sa.BigInteger(), nullable=False),
        sa.Column("retry_at", _AT, nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("usage", sa.JSON(), nullable=False),
        sa.Column("created_at", _AT, nullable=False),
        sa.Column("updated_at", _AT, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_threads"),
    )
    op.create_index("ix_threads_parent_id", "threads", ["parent_id"])
    op.create_index("ix_threads_created_at_id", "threads", ["created_at", "id"])

    op.create_table(
        "items",
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("message_id", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("thread_id", "seq", name="pk_items"),
        sa.UniqueConstraint("thread_id", "message_id", name="uq_items_thread_id_message_id"),
        _thread_fk("items"),
    )

    op.create_table(
        "calls",
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("call_id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("subscription", sa.Boolean(), nullable=False),
        sa.Column("passive", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("thread_id", "call_id", name="pk_calls"),
        _thread_fk("calls"),
    )

    op.create_table(
        "inbox",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("message_id", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", _AT, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_inbox"),
        sa.UniqueConstraint("thread_id", "message_id", name="uq_inbox_thread_id_message_id"),
        _thread_fk("inbox"),
        sqlite_autoincrement=True,
    )
    _partial("ix_inbox_pending", "inbox", ["thread_id", "id"], "state = 'pending'")

    op.create_table(
        "outbox",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("call_id", sa.String(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("created_at", _AT, nullable=False),
        sa.Column("dispatched_at", _AT, nullable=True),
        sa.Column("ran_at", _AT, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_outbox"),
        _thread_fk("outbox"),
        sqlite_autoincrement=True,
    )
    _partial("ix_outbox_undispatched", "outbox", ["created_at"], "dispatched_at IS NULL")
    _partial("ix_outbox_unran", "outbox", ["dispatched_at"], "ran_at IS NULL")

    op.create_table(
        "timers",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("call_id", sa.String(), nullable=False),
        sa.Column("due_at", _AT, nullable=False),
        sa.Column("message_id", sa.String(), nullable=False),
        sa.Column("message", sa.JSON(), nullable=False),
        sa.Column("fired_at", _AT, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_timers"),
        sa.UniqueConstraint("thread_id", "message_id", name="uq_timers_thread_id_message_id"),
        _thread_fk("timers"),
        sqlite_autoincrement=True,
    )
    _partial("ix_timers_unfired", "timers", ["due_at"], "fired_at IS NULL")


def downgrade() -> None:
    for table in ("timers", "outbox", "inbox", "calls", "items"):
        op.drop_table(table)
    op.drop_index("ix_threads_created_at_id", table_name="threads")
    op.drop_index("ix_threads_parent_id", table_name="threads")
    op.drop_table("threads")
