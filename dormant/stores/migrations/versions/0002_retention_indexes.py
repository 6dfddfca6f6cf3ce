"""Indexes for retention and quarantine: thread trees by root, closed threads by age,
quarantined inbox rows.

``dormant prune`` finds closed roots whose whole tree is closed (by ``root_id``) and lists
quarantined rows across threads; without these it would read the hot tables end to end.
The partial indexes hold only closed threads and quarantined rows, so the writes of live
threads do not pay for them.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    """A table's name under the deployment's prefix."""
    return (context.config.get_main_option("table_prefix") or "") + name


def _partial(name: str, table: str, columns: list[str], where: str) -> None:
    op.create_index(
        f"ix_{_t(name)}",
        _t(table),
        columns,
        postgresql_where=sa.text(where),
        sqlite_where=sa.text(where),
    )


def upgrade() -> None:
    op.create_index(f"ix_{_t('threads')}_root_id", _t("threads"), ["root_id"])
    _partial("threads_closed", "threads", ["updated_at"], "status = 'closed'")
    _partial("inbox_quarantined", "inbox", ["id"], "state = 'quarantined'")


def downgrade() -> None:
    op.drop_index(f"ix_{_t('inbox_quarantined')}", table_name=_t("inbox"))
    op.drop_index(f"ix_{_t('threads_closed')}", table_name=_t("threads"))
    op.drop_index(f"ix_{_t('threads')}_root_id", table_name=_t("threads"))
