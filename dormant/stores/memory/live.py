"""``MemoryLive``: the live log of ``LocalSystem``'s streams, in this process.

The same rules as ``RedisLive``'s Lua (``dormant/stores/redis_live.py``): a thread has a log
only while someone watched it in the last ``ttl_s``, so an unwatched thread costs one dict
lookup an event; entries are numbered from the boundary the reader saw in the store; a
chunk from a new attempt while another's text is pending, or a status change while text is
pending, first writes a ``retry``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dormant.messages import AssistantTurn, Chunk, Event, ItemAdded, StatusChanged
from dormant.streams import LiveEntry

__all__ = ["MemoryLive", "abandoned_reason", "retried_reason"]


def retried_reason() -> str:
    return "the model's answer was abandoned and is being retried"


def abandoned_reason(status: str) -> str:
    return f"the turn was abandoned: the thread is now {status}"


def _boundary(attempt: str) -> int:
    """The boundary a chunk's attempt names (``"<seq>:<token>:<n>"``); 0 if none."""
    head = attempt.partition(":")[0]
    return int(head) if head.isdigit() else 0


def _now_us() -> int:
    return time.time_ns() // 1000


@dataclass
class _Log:
    entries: deque[LiveEntry]
    watched_until: float
    c: int | None = None
    last: tuple[int, int] = (0, 0)
    partial: str | None = None
    """The attempt whose chunks are pending (no item or retry since)."""
    closed: tuple[int, int] | None = None

    def add(self, kind: str, data: dict[str, Any], now_us: int, n: int | None = None) -> None:
        c = self.c or 0
        if n is None:
            n = max(self.last[1] + 1, now_us) if self.last[0] == c else now_us
        if (c, n) <= self.last:
            return
        self.last = (c, n)
        self.entries.append(LiveEntry(c, n, kind, data))

    def append(self, event: Event, now_us: int) -> None:
        if self.c is None:
            return  # the reader has not seen the store yet: it will
        if isinstance(event, ItemAdded):
            cid = event.seq + 1
            self.c = max(self.c, cid)
            if isinstance(event.item, AssistantTurn):
                self.partial = None  # the answer is in: its text is no longer pending
            self.add("item", event.model_dump(mode="json"), now_us, n=0)
            return
        if isinstance(event, Chunk):
            if _boundary(event.attempt) < self.c:
                return  # the text of a turn whose items the log holds: they supersede it
            if self.partial is not None and self.partial != event.attempt:
                self.add("retry", {"reason": retried_reason()}, now_us)
            self.partial = event.attempt
        elif isinstance(event, StatusChanged) and self.partial is not None:
            self.add("retry", {"reason": abandoned_reason(event.status)}, now_us)
            self.partial = None
        self.add(event.kind, event.model_dump(mode="json"), now_us)
        if isinstance(event, StatusChanged) and event.status == "closed":
            self.closed = self.last


class MemoryLive:
    """``LiveLog`` in memory; ``append`` is ``LocalSystem``'s event sink's second half."""

    def __init__(
        self, *, keep: int = 1000, ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.keep = keep
        self.ttl_s = ttl_s
        self._clock = clock
        self._changed = threading.Condition()
        self._logs: dict[str, _Log] = {}

    def _live(self, thread_id: str) -> _Log | None:
        log = self._logs.get(thread_id)
        if log is not None and log.watched_until < self._clock():
            del self._logs[thread_id]  # nobody read it for ttl_s: forget it
            return None
        return log

    def append(self, event: Event) -> None:
        if not self._logs:
            return  # the common case: nobody watches anything
        with self._changed:
            log = self._live(event.thread_id)
            if log is None:
                return
            log.append(event, _now_us())
            self._changed.notify_all()

    def watch(self, thread_id: str, c: int | None) -> None:
        with self._changed:
            until = self._clock() + self.ttl_s
            for tid in [t for t, log in self._logs.items() if log.watched_until < self._clock()]:
                del self._logs[tid]
            log = self._logs.get(thread_id)
            if log is None:
                log = self._logs[thread_id] = _Log(deque(maxlen=self.keep), until)
            log.watched_until = until
            if c is not None and (log.c is None or log.c < c):
                fresh = log.c is None
                log.c = c
                if fresh:
                    log.add("start", {}, _now_us())

    def _after(self, thread_id: str, after: tuple[int, int]) -> list[LiveEntry]:
        log = self._logs.get(thread_id)
        if log is None:
            return []
        return [e for e in log.entries if (e.c, e.n) > after]

    def read(self, thread_id: str, after: tuple[int, int], block_s: float) -> list[LiveEntry]:
        deadline = time.monotonic() + block_s
        with self._changed:
            while True:
                found = self._after(thread_id, after)
                left_s = deadline - time.monotonic()
                if found or left_s <= 0:
                    return found
                self._changed.wait(left_s)

    async def aread(
        self, thread_id: str, after: tuple[int, int], block_s: float
    ) -> list[LiveEntry]:
        """Polls every 20 ms: ``LocalSystem`` serves a handful of readers, not hundreds."""
        deadline = time.monotonic() + block_s
        while True:
            with self._changed:
                found = self._after(thread_id, after)
            if found or time.monotonic() >= deadline:
                return found
            await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def closed_at(self, thread_id: str) -> tuple[int, int] | None:
        with self._changed:
            log = self._logs.get(thread_id)
            return log.closed if log is not None else None
