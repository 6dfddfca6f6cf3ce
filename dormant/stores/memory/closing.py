"""Closing and idleness for the in-memory store: closing a subtree, cancelling timers,
finding threads idle past a limit.

``MemoryClosing`` is mixed into ``MemoryStore`` and runs under its lock, inside a commit.
"""

from __future__ import annotations

import itertools
import threading
from datetime import datetime

from dormant.stores.base import OutboxRow, ThreadInfo, ThreadStatus, TimerRow
from dormant.stores.closing import close_calls, streams_to_stop
from dormant.stores.lineage import next_seq
from dormant.stores.memory import thread as stored

__all__ = ["MemoryClosing"]


class MemoryClosing:
    _lock: threading.RLock
    _threads: dict[str, stored.StoredThread]
    _outbox: dict[int, OutboxRow]
    _timers: dict[int, TimerRow]
    _ids: itertools.count[int]

    def children(self, thread_id: str) -> list[ThreadInfo]:
        raise NotImplementedError

    def _heat(self, thread_id: str, t: stored.StoredThread) -> stored.Hot:
        raise NotImplementedError

    def _cool(self, thread_id: str, t: stored.StoredThread) -> None:
        raise NotImplementedError

    def idle_threads(self, agent: str, idle_before: datetime, limit: int = 100) -> list[str]:
        with self._lock:
            infos = [stored.info_of(t) for t in self._threads.values()]
        idle = [
            i
            for i in infos
            if i.agent == agent and i.status is ThreadStatus.IDLE and i.updated_at < idle_before
        ]
        idle.sort(key=lambda i: (i.updated_at, i.id))
        return [i.id for i in idle[:limit]]

    def _close_descendants(self, thread_id: str, now: datetime) -> list[OutboxRow]:
        """Close every open descendant: its pending calls answered, its timers cancelled
        and its live subscriptions cancelled (``stores/closing.py``), with "cancel" outbox
        rows."""
        rows: list[OutboxRow] = []
        for child in self.children(thread_id):
            t = self._threads[child.id]
            if child.status is not ThreadStatus.CLOSED:
                hot = self._heat(child.id, t)
                first = next_seq(hot.info, hot.items)
                changed, results = close_calls(child.id, hot.calls.values(), first)
                for call in streams_to_stop(hot.calls.values(), child):
                    row = OutboxRow(next(self._ids), child.id, call.call_id, "cancel", now)
                    self._outbox[row.id] = row
                    rows.append(row)
                self._cancel_timers(child.id, set(hot.calls))
                hot.calls.update({c.call_id: c for c in changed})
                hot.items += results
                hot.unsaved += len(results)
                reason = f"its ancestor {thread_id} was closed"
                stored.update(t, status=ThreadStatus.CLOSED, closed_reason=reason)
                self._cool(child.id, t)
            rows += self._close_descendants(child.id, now)
        return rows

    def _cancel_timers(self, thread_id: str, call_ids: set[str]) -> None:
        if not call_ids:
            return
        for timer_id, timer in list(self._timers.items()):
            if timer.thread_id == thread_id and timer.call_id in call_ids:
                del self._timers[timer_id]
