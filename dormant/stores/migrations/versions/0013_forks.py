"""Forks: a thread whose history is another's up to ``fork_seq``, by reference.

``threads.source_id`` names the thread a fork inherits from (``runtime/forks.py``); its
index lets retention keep a source while a fork still reads it. ``threads.tag`` is a
replay's tag: ``dormant usage`` sums its usage apart from production's. A plain ALTER TABLE on
both dialects: the upgrade touches no existing row.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    op.add_column(_t("threads"), sa.Column("source_id", sa.String(), nullable=True))
    op.add_column(_t("threads"), sa.Column("tag", sa.String(), nullable=True))
    op.create_index(f"ix_{_t('threads')}_source_id", _t("threads"), ["source_id"])


def downgrade() -> None:
    op.drop_index(f"ix_{_t('threads')}_source_id", table_name=_t("threads"))
    op.drop_column(_t("threads"), "tag")
    op.drop_column(_t("threads"), "source_id")  # SQLite 3.35+: ALTER TABLE DROP COLUMN
