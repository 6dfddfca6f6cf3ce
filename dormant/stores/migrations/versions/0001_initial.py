"""The initial schema: threads, items, calls, inbox, outbox, timers.

Compaction summaries are items (kind ``summary``) at their own position, so they need
no table of their own. Every table, index and constraint name carries the deployment's
table prefix (the ``table_prefix`` option; empty by default).

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_AT = sa.DateTime(timezone=True)


def _t(name: str) -> str:
    """A table's name under the deployment's prefix."""
    return (context.config.get_main_option("table_prefix") or "") + name


def _thread_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["thread_id"], [f"{_t('threads')}.id"], name=f"fk_{_t(table)}_thread_id_{_t('threads')}"
    )


def _partial(name: str, table: str, columns: list[str], where: str) -> None:
    op.create_index(
        f"ix_{_t(name)}",
        _t(table),
        columns,
        postgresql_where=sa.text(where),
        sqlite_where=sa.text(where),
    )


def upgrade() -> None:
    op.create_table(
        _t("threads"),
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
        sa.PrimaryKeyConstraint("id", name=f"pk_{_t('threads')}"),
    )
    op.create_index(f"ix_{_t('threads')}_parent_id", _t("threads"), ["parent_id"])
    op.create_index(f"ix_{_t('threads')}_created_at_id", _t("threads"), ["created_at", "id"])

    op.create_table(
        _t("items"),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("message_id", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("thread_id", "seq", name=f"pk_{_t('items')}"),
        sa.UniqueConstraint(
            "thread_id", "message_id", name=f"uq_{_t('items')}_thread_id_message_id"
        ),
        _thread_fk("items"),
    )

    op.create_table(
        _t("calls"),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("call_id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("subscription", sa.Boolean(), nullable=False),
        sa.Column("passive", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("thread_id", "call_id", name=f"pk_{_t('calls')}"),
        _thread_fk("calls"),
    )

    op.create_table(
        _t("inbox"),
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("message_id", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", _AT, nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"pk_{_t('inbox')}"),
        sa.UniqueConstraint(
            "thread_id", "message_id", name=f"uq_{_t('inbox')}_thread_id_message_id"
        ),
        _thread_fk("inbox"),
        sqlite_autoincrement=True,
    )
    _partial("inbox_pending", "inbox", ["thread_id", "id"], "state = 'pending'")

    op.create_table(
        _t("outbox"),
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("call_id", sa.String(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("created_at", _AT, nullable=False),
        sa.Column("dispatched_at", _AT, nullable=True),
        sa.Column("ran_at", _AT, nullable=True),
        sa.PrimaryKeyConstraint("id", name=f"pk_{_t('outbox')}"),
        _thread_fk("outbox"),
        sqlite_autoincrement=True,
    )
    _partial("outbox_undispatched", "outbox", ["created_at"], "dispatched_at IS NULL")
    _partial("outbox_unran", "outbox", ["dispatched_at"], "ran_at IS NULL")

    op.create_table(
        _t("timers"),
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("call_id", sa.String(), nullable=False),
        sa.Column("due_at", _AT, nullable=False),
        sa.Column("message_id", sa.String(), nullable=False),
        sa.Column("message", sa.JSON(), nullable=False),
        sa.Column("fired_at", _AT, nullable=True),
        sa.PrimaryKeyConstraint("id", name=f"pk_{_t('timers')}"),
        sa.UniqueConstraint(
            "thread_id", "message_id", name=f"uq_{_t('timers')}_thread_id_message_id"
        ),
        _thread_fk("timers"),
        sqlite_autoincrement=True,
    )
    _partial("timers_unfired", "timers", ["due_at"], "fired_at IS NULL")


def downgrade() -> None:
    for table in ("timers", "outbox", "inbox", "calls", "items"):
        op.drop_table(_t(table))
    op.drop_index(f"ix_{_t('threads')}_created_at_id", table_name=_t("threads"))
    op.drop_index(f"ix_{_t('threads')}_parent_id", table_name=_t("threads"))
    op.drop_table(_t("threads"))
