"""The SQL store's sweeper queries: threads with rows no slice has looked at, the next
timer due, idle threads for the idle limit. Mixed into ``SQLStore`` (as ``SQLRoster`` is)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime

from sqlalchemy import Connection, literal_column, select

from dormant.stores.base import ThreadStatus
from dormant.stores.sql.direct import run
from dormant.stores.sql.engine import retry_busy
from dormant.stores.sql.prepared import prepared
from dormant.stores.sql.tables import Schema, as_utc

__all__ = ["SQLSweep"]


class SQLSweep:
    """What the sweeper asks of ``SQLStore``'s tables."""

    _schema: Schema

    def _tx(
        self, *, write: bool = False, snapshot: bool = False, direct: bool = False
    ) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    def threads_to_wake(self, limit: int = 100, *, now: datetime | None = None) -> list[str]:
        """Threads with rows no slice has looked at, the longest-waiting first; stalled
        ones wait for ``retry``."""
        return [thread_id for thread_id, _ in self.wakes_due(limit, now=now)]

    @retry_busy
    def wakes_due(self, limit: int = 100, *, now: datetime | None = None) -> list[tuple[str, int]]:
        with self._tx(direct=True) as conn:
            ready = prepared(conn)
            if now is None:
                found = run(conn, ready.threads_to_wake, {"limit": limit})
            else:
                params = {"limit": limit, "now": as_utc(now)}
                found = run(conn, ready.threads_to_wake_at, params)
            return [(r["thread_id"], r["priority"]) for r in found.rows]

    @retry_busy
    def next_timer_due(self) -> datetime | None:
        with self._tx(direct=True) as conn:
            found = run(conn, prepared(conn).next_timer_due).scalars()
            due: datetime | None = found[0] if found else None
            return due

    @retry_busy
    def idle_threads(self, agent: str, idle_before: datetime, limit: int = 100) -> list[str]:
        threads = self._schema.threads
        query = (  # ix_threads_idle: (agent, updated_at) where status = 'idle'
            select(threads.c.id)
            .where(
                # a literal keeps the partial index usable by generic plans
                threads.c.status == literal_column(f"'{ThreadStatus.IDLE.value}'"),
                threads.c.agent == agent,
                threads.c.updated_at < as_utc(idle_before),
            )
            .order_by(threads.c.updated_at, threads.c.id)
            .limit(limit)
        )
        with self._tx() as conn:
            return list(conn.execute(query).scalars())
