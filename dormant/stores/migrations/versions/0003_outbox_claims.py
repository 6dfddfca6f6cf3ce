"""Outbox claims: a running tool task's heartbeat, so a dead run is re-sent in seconds.

``claimed_until`` is set when a ``dormant.tool`` task starts a row and renewed while the
tool runs; the sweeper sends again a row whose claim lapsed (its worker died, or its task
was lost with a flushed broker) instead of waiting for the broker's visibility timeout.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    with op.batch_alter_table(_t("outbox")) as batch:
        batch.add_column(sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        f"ix_{_t('outbox_claimed')}",
        _t("outbox"),
        ["claimed_until"],
        postgresql_where=sa.text("ran_at IS NULL"),
        sqlite_where=sa.text("ran_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index(f"ix_{_t('outbox_claimed')}", table_name=_t("outbox"))
    with op.batch_alter_table(_t("outbox")) as batch:
        batch.drop_column("claimed_until")
