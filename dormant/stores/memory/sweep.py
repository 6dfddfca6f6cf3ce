"""Timers and outbox rows in the in-memory store, and what the sweeper asks of them: due
timers fired into the inbox, outbox rows to dispatch again and their claims, threads to
wake.

``MemorySweep`` is mixed into ``MemoryStore``: it keeps the store's timer heap and outbox
under the store's lock. A timer lives in ``_timers`` by id, its due time in a heap whose
cancelled entries are skipped lazily, and its (thread, message id) in ``_timer_keys`` so a
repeated one is ignored.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import replace
from datetime import UTC, datetime

from dormant.messages import Inbound
from dormant.stores.base import (
    InboxRow,
    InboxState,
    NewTimer,
    OutboxRow,
    Priority,
    ThreadStatus,
    TimerRow,
)
from dormant.stores.memory import thread as stored

__all__ = ["MemorySweep"]


class MemorySweep:
    _lock: threading.RLock
    _threads: dict[str, stored.StoredThread]
    _open: dict[str, dict[int, InboxRow]]
    _outbox: dict[int, OutboxRow]
    _call_traces: dict[tuple[str, str], str]
    _timers: dict[int, TimerRow]
    _timer_heap: list[tuple[datetime, int]]
    _timer_keys: set[tuple[str, str]]
    _ids: itertools.count[int]

    def _insert_row(
        self,
        t: stored.StoredThread,
        thread_id: str,
        message_id: str,
        message: Inbound,
        priority: int,
    ) -> InboxRow:
        raise NotImplementedError

    def mark_dispatched(self, outbox_ids: list[int]) -> None:
        now = stored.now()
        with self._lock:
            for row_id in outbox_ids:
                row = self._outbox.get(row_id)
                if row is not None:
                    self._outbox[row_id] = replace(row, dispatched_at=now)

    def mark_ran(self, outbox_ids: list[int]) -> None:
        with self._lock:
            for row_id in outbox_ids:
                row = self._outbox.pop(row_id, None)  # ran rows are done with: keep nothing
                if row is not None and row.trace:  # but a traced call's context (call_trace)
                    self._call_traces[(row.thread_id, row.call_id)] = row.trace

    def fire_due_timers(self, now: datetime, limit: int = 100) -> list[InboxRow]:
        fired: list[InboxRow] = []
        with self._lock:
            while self._timer_heap and self._timer_heap[0][0] <= now and len(fired) < limit:
                _, timer_id = heapq.heappop(self._timer_heap)
                timer = self._timers.pop(timer_id, None)
                if timer is None:
                    continue  # cancelled
                t = self._threads.get(timer.thread_id)
                if t is None or t.seen(timer.message_id):
                    continue
                row = self._insert_row(
                    t, timer.thread_id, timer.message_id, timer.message, Priority.BACKGROUND
                )
                fired.append(row)
        return fired

    def undispatched(
        self, older_than: datetime, limit: int = 100, *, lost_before: datetime | None = None
    ) -> list[OutboxRow]:
        def stranded(row: OutboxRow) -> bool:
            if row.dispatched_at is None:
                return row.created_at <= older_than
            if lost_before is None or row.dispatched_at > lost_before:
                return False
            return row.claimed_until is None or row.claimed_until <= lost_before

        with self._lock:
            rows = [r for r in self._outbox.values() if stranded(r)]
        return sorted(rows, key=lambda r: r.id)[:limit]

    def claim_outbox(self, outbox_id: int, until: datetime) -> int:
        with self._lock:
            row = self._outbox.get(outbox_id)
            live = row is not None and row.claimed_until is not None
            if row is None or (live and row.claimed_until >= datetime.now(UTC)):  # type: ignore[operator]
                return 0
            self._outbox[outbox_id] = replace(row, claimed_until=until, runs=row.runs + 1)
            return row.runs + 1

    def unclaim_outbox(self, outbox_id: int) -> None:
        with self._lock:
            row = self._outbox.get(outbox_id)
            if row is not None and row.runs > 0:
                self._outbox[outbox_id] = replace(
                    row, claimed_until=None, dispatched_at=None, runs=row.runs - 1
                )

    def renew_outbox_claim(self, outbox_id: int, until: datetime) -> bool:
        with self._lock:
            row = self._outbox.get(outbox_id)
            if row is None:
                return False
            self._outbox[outbox_id] = replace(row, claimed_until=until)
            return True

    def expired_claims(self, now: datetime, limit: int = 100) -> list[OutboxRow]:
        with self._lock:
            rows = [
                r
                for r in self._outbox.values()
                if r.claimed_until is not None and r.claimed_until < now
            ]
        return sorted(rows, key=lambda r: r.id)[:limit]

    def reclaim_outbox(self, outbox_id: int, now: datetime) -> bool:
        with self._lock:
            row = self._outbox.get(outbox_id)
            if row is None or row.claimed_until is None or row.claimed_until >= now:
                return False
            self._outbox[outbox_id] = replace(row, claimed_until=None, dispatched_at=now)
            return True

    def threads_to_wake(self, limit: int = 100, *, now: datetime | None = None) -> list[str]:
        return [thread_id for thread_id, _ in self.wakes_due(limit, now=now)]

    def wakes_due(self, limit: int = 100, *, now: datetime | None = None) -> list[tuple[str, int]]:
        with self._lock:
            waiting: list[tuple[int, int, str]] = []  # (-priority, oldest pending row, thread)
            for thread_id, rows in self._open.items():
                pending = [r for r in rows.values() if r.state is InboxState.PENDING]
                if not pending:
                    continue
                info = stored.info_of(self._threads[thread_id])
                backing_off = now is not None and info.retry_at is not None and info.retry_at > now
                if backing_off and info.failures == 0:  # deferred for model capacity:
                    # user text sent after the deferral does not wait for its place; user
                    # text the deferral saw (told its turn) does
                    pending = [
                        r
                        for r in pending
                        if r.priority >= Priority.INTERACTIVE and r.id > info.inbox_seen
                    ]
                    backing_off = not pending
                if info.status is not ThreadStatus.STALLED and not backing_off:
                    oldest = min(r.id for r in pending)
                    waiting.append((-max(r.priority for r in pending), oldest, thread_id))
            # user text first, then the longest waiting (a burst of deferred background
            # threads coming due never holds back a user's message)
            return [(thread_id, -negated) for negated, _, thread_id in sorted(waiting)[:limit]]

    def next_timer_due(self) -> datetime | None:
        with self._lock:
            while self._timer_heap and self._timer_heap[0][1] not in self._timers:
                heapq.heappop(self._timer_heap)
            return self._timer_heap[0][0] if self._timer_heap else None

    def _add_timer(self, thread_id: str, timer: NewTimer) -> None:
        key = (thread_id, timer.message_id)
        if key in self._timer_keys:
            return
        self._timer_keys.add(key)
        row = TimerRow(
            next(self._ids), thread_id, timer.call_id, timer.due_at, timer.message_id, timer.message
        )
        self._timers[row.id] = row
        heapq.heappush(self._timer_heap, (row.due_at, row.id))
