"""An index for listing threads of one status, newest first (the dashboard's filter).

The list of stalled threads read the whole ``threads`` table (a sequential scan and a sort:
17 ms at 100K threads, growing with the table) because stalled threads are rare and no
index led with ``status``. ``(status, created_at, id)`` answers each page of each status,
keyset included, from the index alone (``bench/dashboard_listing.py``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import context, op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    op.create_index(
        f"ix_{_t('threads')}_status_created_at_id", _t("threads"), ["status", "created_at", "id"]
    )


def downgrade() -> None:
    op.drop_index(f"ix_{_t('threads')}_status_created_at_id", table_name=_t("threads"))
