"""The SQL store's answer to ``unfired_timers`` (the open approvals)."""

from __future__ import annotations

from contextlib import AbstractContextManager

from sqlalchemy import Connection, select

from dormant.messages import InboundAdapter
from dormant.stores.base import TimerRow
from dormant.stores.sql.engine import retry_busy
from dormant.stores.sql.tables import Schema

__all__ = ["SQLTimerQuery"]


class SQLTimerQuery:
    """Mixed into ``SQLStore`` (as ``SQLRoster`` is)."""

    _schema: Schema

    def _tx(
        self, *, write: bool = False, snapshot: bool = False, direct: bool = False
    ) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    @retry_busy
    def unfired_timers(
        self,
        message_prefix: str,
        *,
        root_id: str | None = None,
        agent: str | None = None,
        limit: int = 100,
    ) -> list[TimerRow]:
        timers, threads = self._schema.timers, self._schema.threads
        query = (  # ix_timers_unfired narrows it to the timers still to fire
            select(timers)
            .join(threads, threads.c.id == timers.c.thread_id)
            .where(timers.c.fired_at.is_(None), timers.c.message_id.startswith(message_prefix))
            .order_by(timers.c.id)
            .limit(limit)
        )
        if root_id is not None:
            query = query.where(threads.c.root_id == root_id)
        if agent is not None:
            query = query.where(threads.c.agent == agent)
        with self._tx() as conn:
            rows = conn.execute(query).mappings().all()
        return [
            TimerRow(
                r["id"],
                r["thread_id"],
                r["call_id"],
                r["due_at"],
                r["message_id"],
                InboundAdapter.validate_python(r["message"]),
                r["fired_at"],
            )
            for r in rows
        ]
