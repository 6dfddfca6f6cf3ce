"""Closing from outside: why a thread was closed, and finding threads idle past a limit.

``closed_reason`` keeps the reason given to ``close_thread`` (or the idle limit, or the
ancestor whose close closed it) on the thread's record. ``ix_threads_idle`` lets the
sweeper find an agent's threads idle since before a time (``Agent(close_after_idle_s=...)``)
without reading the threads that are busy or closed.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    with op.batch_alter_table(_t("threads")) as batch:
        batch.add_column(sa.Column("closed_reason", sa.Text(), nullable=False, server_default=""))
    op.create_index(
        f"ix_{_t('threads_idle')}",
        _t("threads"),
        ["agent", "updated_at"],
        postgresql_where=sa.text("status = 'idle'"),
        sqlite_where=sa.text("status = 'idle'"),
    )


def downgrade() -> None:
    op.drop_index(f"ix_{_t('threads_idle')}", table_name=_t("threads"))
    with op.batch_alter_table(_t("threads")) as batch:
        batch.drop_column("closed_reason")
