"""The SQL store's roster of workers (``workers``, migration 0011): one row a process that
runs agents, replaced at each announcement."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, func, select, update

from dormant.stores.base import AgentCard, ThreadStatus, VersionSpan, WorkerCard
from dormant.stores.records import version_spans
from dormant.stores.sql.engine import retry_busy
from dormant.stores.sql.statements import get_thread
from dormant.stores.sql.tables import Schema, as_utc

__all__ = ["SQLRoster"]


class SQLRoster:
    """``WorkerRoster`` on ``SQLStore``'s tables; mixed into it (as ``SQLClaims`` is)."""

    _schema: Schema

    def _tx(
        self, *, write: bool = False, snapshot: bool = False, direct: bool = False
    ) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    @retry_busy
    def announce(self, card: WorkerCard, forget_before: datetime) -> None:
        workers = self._schema.workers
        values = _values(card)
        with self._tx(write=True) as conn:
            # An update first, an insert if there was nothing to update: the same on SQLite
            # and PostgreSQL, and a worker is its own only writer.
            found = conn.execute(
                update(workers).where(workers.c.id == card.worker_id).values(values)
            )
            if not found.rowcount:
                conn.execute(workers.insert().values(id=card.worker_id, **values))
            conn.execute(delete(workers).where(workers.c.seen_at < as_utc(forget_before)))

    @retry_busy
    def roster(self) -> list[WorkerCard]:
        workers = self._schema.workers
        with self._tx() as conn:
            rows = conn.execute(select(workers)).mappings().all()
        return [_card(row) for row in rows]

    @retry_busy
    def open_threads_by_version(self) -> dict[tuple[str, str], int]:
        threads = self._schema.threads
        query = (
            select(threads.c.agent, threads.c.code_version, func.count())
            .where(threads.c.status != ThreadStatus.CLOSED.value)
            .group_by(threads.c.agent, threads.c.code_version)
        )
        with self._tx() as conn:
            return {(agent, version): n for agent, version, n in conn.execute(query)}

    @retry_busy
    def version_spans(self, thread_id: str) -> list[VersionSpan]:
        table = self._schema.version_changes
        query = select(table).where(table.c.thread_id == thread_id).order_by(table.c.from_seq)
        with self._tx() as conn:
            info = get_thread(conn, thread_id)
            rows = conn.execute(query).mappings().all()
        changes = [(r["from_seq"], r["code_version"], r["previous"], r["at"]) for r in rows]
        return version_spans(info, changes)


def _values(card: WorkerCard) -> dict[str, Any]:
    agents = {
        name: {"version": a.version, "tools": sorted(a.tools)} for name, a in card.agents.items()
    }
    return {
        "host": card.host,
        "agents": agents,
        "started_at": card.started_at,
        "seen_at": card.seen_at,
    }


def _card(row: Any) -> WorkerCard:
    agents = {
        name: AgentCard(str(a.get("version", "")), frozenset(a.get("tools", ())))
        for name, a in (row["agents"] or {}).items()
    }
    return WorkerCard(row["id"], row["host"], agents, row["started_at"], row["seen_at"])
