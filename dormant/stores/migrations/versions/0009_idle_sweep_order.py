"""The idle sweep's index in the sweep's own order: ``(agent, updated_at, id)``.

``ix_threads_idle`` was ``(agent, updated_at)``, and the idle sweep asks for an agent's
oldest idle threads ``ORDER BY updated_at, id LIMIT 100``. Among threads idle since the
same instant, PostgreSQL had to read and sort every one of them before the limit: with
100,000 threads that went idle together (a bulk import, or the bench's clones) one sweep
read 100,000 index entries, 150 ms, and a million took it to seconds. With ``id`` in the
index the rows come in the order asked and the read stops after the limit
(``docs/benchmarks.md``, a million idle threads).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def _idle_index(columns: list[str]) -> None:
    op.create_index(
        f"ix_{_t('threads_idle')}",
        _t("threads"),
        columns,
        postgresql_where=sa.text("status = 'idle'"),
        sqlite_where=sa.text("status = 'idle'"),
    )


def upgrade() -> None:
    op.drop_index(f"ix_{_t('threads_idle')}", table_name=_t("threads"))
    _idle_index(["agent", "updated_at", "id"])


def downgrade() -> None:
    op.drop_index(f"ix_{_t('threads_idle')}", table_name=_t("threads"))
    _idle_index(["agent", "updated_at"])
