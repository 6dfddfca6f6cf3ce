"""The in-memory store's answer to ``unfired_timers`` (the open approvals)."""

from __future__ import annotations

import threading

from dormant.stores.base import TimerRow
from dormant.stores.memory import thread as stored

__all__ = ["MemoryTimerQuery"]


class MemoryTimerQuery:
    """Mixed into ``MemoryStore``: reads its timers under its lock."""

    _lock: threading.RLock
    _threads: dict[str, stored.StoredThread]
    _timers: dict[int, TimerRow]

    def unfired_timers(
        self,
        message_prefix: str,
        *,
        root_id: str | None = None,
        agent: str | None = None,
        limit: int = 100,
    ) -> list[TimerRow]:
        found: list[TimerRow] = []
        with self._lock:
            for timer_id in sorted(self._timers):  # fired timers leave ``_timers``
                timer = self._timers[timer_id]
                if not timer.message_id.startswith(message_prefix):
                    continue
                t = self._threads.get(timer.thread_id)
                if t is None:
                    continue
                info = stored.info_of(t)
                if root_id is not None and info.root_id != root_id:
                    continue
                if agent is not None and info.agent != agent:
                    continue
                found.append(timer)
                if len(found) >= limit:
                    break
        return found
