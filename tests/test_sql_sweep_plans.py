"""The idle sweep on PostgreSQL reads its rows in index order and stops at its limit.

Migration 0009 put ``id`` in ``ix_threads_idle``: the sweep asks for an agent's oldest idle
threads ``ORDER BY updated_at, id LIMIT n``, and with ``(agent, updated_at)`` alone every
thread idle since the same instant had to be read and sorted before the limit (a million
of them in ``bench/idle_scale.py``). The plan is what is checked: sequential scans are
switched off so that the small table takes the path a large one would.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, text

from dormant.stores.base import NewThread
from dormant.stores.sql.store import SQLStore
from tests.conftest import _truncate_postgres


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[SQLStore]:
    _truncate_postgres(postgres_url)
    store = SQLStore(postgres_url)
    yield store
    store.close()


def test_the_idle_sweep_reads_in_index_order_among_threads_idle_since_one_instant(
    pg_store: SQLStore,
) -> None:
    for n in range(50):
        pg_store.create_thread(NewThread(id=f"t{n:02}", agent="a"))
    went_idle = datetime(2026, 12, 1, tzinfo=UTC)
    statements: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        statements.append((statement, params))

    with pg_store._engine.begin() as conn:
        conn.execute(
            text("UPDATE threads SET status = 'idle', updated_at = :at"), {"at": went_idle}
        )
        conn.exec_driver_sql("ANALYZE threads")
    event.listen(pg_store._engine, "before_cursor_execute", capture)

    oldest = pg_store.idle_threads("a", went_idle + timedelta(seconds=1), limit=10)

    assert oldest == [f"t{n:02}" for n in range(10)]
    statement, params = statements[-1]
    with pg_store._engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {statement}", params).scalars())
    assert "ix_threads_idle" in plan
    assert "Sort" not in plan, plan
