"""Threads by tag: the dashboard's page for a replay tag finds its replays by the tag,
whatever their age, a page at a time (``Store.threads(tag=...)``).

A partial index on ``(tag, created_at, id)`` of the tagged threads only (replays): the
untagged production threads, nearly all of them, add nothing to it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    op.create_index(
        f"ix_{_t('threads_tagged')}",
        _t("threads"),
        ["tag", "created_at", "id"],
        postgresql_where=sa.text("tag IS NOT NULL"),
        sqlite_where=sa.text("tag IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(f"ix_{_t('threads_tagged')}", table_name=_t("threads"))
