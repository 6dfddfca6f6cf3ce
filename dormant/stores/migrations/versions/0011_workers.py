"""The roster of workers (each process that runs agents announces its agents, tools and
versions) and each thread's ``code_version`` (the agent version of its last slice).

A worker that lacks a thread's agent or a call's tool (a rolling deploy's old or new code)
asks the roster whether a live worker has it before it answers for it
(``runtime/whereabouts.py``). A new table: the upgrade touches no existing row.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    # A plain ALTER TABLE on both dialects: instant, where a batch copy of the threads
    # table would rewrite it (and SQLite's foreign keys refuse its DROP TABLE).
    op.add_column(
        _t("threads"), sa.Column("code_version", sa.String(), server_default="", nullable=False)
    )
    op.create_table(
        _t("workers"),
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("agents", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"pk_{_t('workers')}"),
    )


def downgrade() -> None:
    op.drop_table(_t("workers"))
    op.drop_column(_t("threads"), "code_version")  # SQLite 3.35+: ALTER TABLE DROP COLUMN
