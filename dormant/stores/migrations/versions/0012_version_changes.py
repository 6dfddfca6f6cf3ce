"""Each thread's record of the agent versions that ran it: a row per deploy that met the
thread (``version_changes``), so ``dormant show`` and the dashboard say which code ran each
slice, not only the last one (``threads.code_version``, migration 0011).

A new table: the upgrade touches no existing row, and the code of 0011 runs on it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    op.create_table(
        _t("version_changes"),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("from_seq", sa.Integer(), nullable=False),
        sa.Column("code_version", sa.String(), nullable=False),
        sa.Column("previous", sa.String(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"],
            [f"{_t('threads')}.id"],
            name=f"fk_{_t('version_changes')}_thread_id_{_t('threads')}",
        ),
        sa.PrimaryKeyConstraint("thread_id", "from_seq", name=f"pk_{_t('version_changes')}"),
    )


def downgrade() -> None:
    op.drop_table(_t("version_changes"))
