"""Outbox runs: how many times a tool task started each row.

A tool that kills its worker (out of memory, a segfault in a native library) was re-run
each time its claim lapsed, for ever, and no stored row showed it. ``runs`` counts the
claims taken on a row; the run that finds ``tool_max_runs`` earlier runs died answers the
call with an error instead of starting the tool again.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    with op.batch_alter_table(_t("outbox")) as batch:
        batch.add_column(sa.Column("runs", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table(_t("outbox")) as batch:
        batch.drop_column("runs")
