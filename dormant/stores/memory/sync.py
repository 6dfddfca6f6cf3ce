"""In-process lease and dedup set: what Redis provides in Celery mode, for one process."""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict

__all__ = ["MemoryDedup", "MemoryLease"]


class MemoryLease:
    """``Lease`` for one process: a token and a deadline per thread, and the threads whose
    lease was refused to a slice while held (their holder drains what it was woken for)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, float]] = {}
        self._refused: set[str] = set()
        self._tokens = itertools.count(1)

    def acquire(self, thread_id: str, ttl_s: float) -> str | None:
        now = time.monotonic()
        with self._lock:
            held = self._held.get(thread_id)
            if held is not None and held[1] > now:
                self._refused.add(thread_id)
                return None
            self._refused.discard(thread_id)
            token = f"{next(self._tokens):x}"  # unique in the process: all a token needs here
            self._held[thread_id] = (token, now + ttl_s)
            return token

    def renew(self, thread_id: str, token: str, ttl_s: float) -> bool:
        now = time.monotonic()
        with self._lock:
            held = self._held.get(thread_id)
            if held is None or held[0] != token or held[1] <= now:
                return False
            self._held[thread_id] = (token, now + ttl_s)
            return True

    def release(self, thread_id: str, token: str) -> bool:
        with self._lock:
            refused = thread_id in self._refused
            held = self._held.get(thread_id)
            if held is not None and held[0] == token:
                del self._held[thread_id]
                self._refused.discard(thread_id)
            return refused

    def held(self, thread_id: str) -> bool:
        with self._lock:
            held = self._held.get(thread_id)
            return held is not None and held[1] > time.monotonic()

    def revoke(self, thread_id: str) -> None:
        with self._lock:
            self._held.pop(thread_id, None)

    def expire_all(self) -> None:
        """Forget every lease, as if their holders died long ago (tests of crashes)."""
        with self._lock:
            self._held.clear()
            self._refused.clear()


class MemoryDedup:
    """``DedupSet`` bounded to ``max_ids`` recent ids: a fast path that may forget."""

    def __init__(self, max_ids: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._ids: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._max_ids = max_ids

    def seen(self, thread_id: str, message_id: str) -> bool:
        with self._lock:
            return (thread_id, message_id) in self._ids

    def add(self, thread_id: str, message_ids: list[str]) -> None:
        with self._lock:
            for message_id in message_ids:
                self._ids[(thread_id, message_id)] = None
            while len(self._ids) > self._max_ids:
                self._ids.popitem(last=False)
