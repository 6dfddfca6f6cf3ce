"""Budgets and the usage ledger.

``threads`` gains the tree totals a budget is checked against (``tree_tokens``,
``tree_cost_nanos``, kept on a root for its whole tree) and ``message_completions`` (the
thread's completions since its last user text). ``ledger`` holds, per thread, one row per
minute in which it called its model, each commit adding its slice's usage to its minute's
row (costs in billionths: exact sums); ``dormant usage`` and ``dormant show`` sum them;
its rows go with their thread when it is pruned. A row per slice cost 12 to 23 KB of
SQLite per agent at 40 completions (``bench/workload.py dormant-sqlite``) for the same
answers at a resolution of a minute.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    with op.batch_alter_table(_t("threads")) as batch:
        batch.add_column(
            sa.Column("tree_tokens", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("tree_cost_nanos", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("message_completions", sa.Integer(), nullable=False, server_default="0")
        )
    ledger = _t("ledger")
    op.create_table(
        ledger,
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completions", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_nanos", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("thread_id", "at", name=f"pk_{ledger}"),
        sa.ForeignKeyConstraint(
            ["thread_id"], [f"{_t('threads')}.id"], name=f"fk_{ledger}_thread_id_{_t('threads')}"
        ),
    )
    op.create_index(f"ix_{ledger}_at", ledger, ["at"])


def downgrade() -> None:
    op.drop_table(_t("ledger"))
    with op.batch_alter_table(_t("threads")) as batch:
        batch.drop_column("message_completions")
        batch.drop_column("tree_cost_nanos")
        batch.drop_column("tree_tokens")
