"""Items store their JSON packed: ``items.packed``, raw deflate with the items' framing.

An item's JSON is mostly model text, and neither database compressed it: PostgreSQL tries
only rows over 2 KB (``TOAST_TUPLE_THRESHOLD``; an item is 1.3 KB at most in the reference
workload) and SQLite never. Packed on its own with a dictionary of the item kinds' JSON
framing (``stores/packing.py``), an item of model text takes about half its bytes
(``docs/benchmarks.md``). Each item is packed alone so that any one row reads back by
itself: a slice reads only the items after those it has cached, a child only its parent's
up to its fork.

The upgrade rewrites nothing: rows written before it keep their JSON in ``data`` (now
nullable) and read back as before, so it is instant on a large PostgreSQL table. The
downgrade unpacks every packed row into ``data`` before dropping the column.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from dormant.stores.packing import ITEM_JSON_FRAMING, unpack

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BATCH_ROWS = 1000


def _t(name: str) -> str:
    return (context.config.get_main_option("table_prefix") or "") + name


def upgrade() -> None:
    with op.batch_alter_table(_t("items")) as batch:
        batch.alter_column("data", existing_type=sa.JSON(), nullable=True)
        batch.add_column(sa.Column("packed", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    items = sa.table(
        _t("items"),
        sa.column("thread_id", sa.String()),
        sa.column("seq", sa.Integer()),
        sa.column("data", sa.JSON()),
        sa.column("packed", sa.LargeBinary()),
    )
    conn = op.get_bind()
    unpacked = (
        sa.select(items.c.thread_id, items.c.seq, items.c.packed)
        .where(items.c.data.is_(None))
        .limit(_BATCH_ROWS)
    )
    fill = (
        sa.update(items)
        .where(
            items.c.thread_id == sa.bindparam("b_thread_id"), items.c.seq == sa.bindparam("b_seq")
        )
        .values(data=sa.bindparam("b_data", type_=sa.JSON()))
    )
    while rows := conn.execute(unpacked).all():
        conn.execute(
            fill,
            [
                {
                    "b_thread_id": r.thread_id,
                    "b_seq": r.seq,
                    "b_data": json.loads(unpack(r.packed, ITEM_JSON_FRAMING)),
                }
                for r in rows
            ],
        )
    with op.batch_alter_table(_t("items")) as batch:
        batch.drop_column("packed")
        batch.alter_column("data", existing_type=sa.JSON(), nullable=False)
