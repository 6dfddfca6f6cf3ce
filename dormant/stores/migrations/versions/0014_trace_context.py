"""The trace context stored with each inbox and outbox row (``dormant.tracing``).

A slice on any worker, days later, continues the trace of the message that woke it, and a
tool task the trace of the slice that wrote its row (docs/tracing.md). One short string
column each (a W3C ``traceparent`` and the time it was taken), empty when nothing was
traced; a column rather than a key inside the inbox row's JSON payload, because the payload
is the message itself, compared when a sender retries (a retried ``deliver`` with another
trace context must still be the same result).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    # A plain ALTER TABLE with a constant default on both dialects: no table rewrite.
    for table in ("inbox", "outbox"):
        op.add_column(_t(table), sa.Column("trace", sa.String(), server_default="", nullable=False))


def downgrade() -> None:
    for table in ("inbox", "outbox"):
        op.drop_column(_t(table), "trace")  # SQLite 3.35+: ALTER TABLE DROP COLUMN
