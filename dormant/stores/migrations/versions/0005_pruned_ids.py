"""Dedup that survives retention: the message ids whose inbox rows were pruned.

Retention deletes a live thread's finished inbox rows; the unique key on
``(thread_id, message_id)`` went with them, so a retried callback, a retried launch or a
re-sent threaded event was taken for new. ``pruned_ids`` keeps, per thread, an 8-byte
BLAKE2b digest of each pruned row's message id that left no item in the history (the
items' own unique key covers the rest); its rows go with the thread when it is pruned.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    op.create_table(
        _t("pruned_ids"),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"],
            [f"{_t('threads')}.id"],
            name=f"fk_{_t('pruned_ids')}_thread_id_{_t('threads')}",
        ),
        sa.PrimaryKeyConstraint("thread_id", "digest", name=f"pk_{_t('pruned_ids')}"),
    )


def downgrade() -> None:
    op.drop_table(_t("pruned_ids"))
