"""The in-memory store's roster of workers: the cards of the processes that run agents."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime

from dormant.stores.base import ThreadStatus, WorkerCard
from dormant.stores.memory import thread as stored

__all__ = ["MemoryRoster"]


class MemoryRoster:
    """``WorkerRoster`` under the store's lock; mixed into ``MemoryStore``."""

    _lock: threading.RLock
    _cards: dict[str, WorkerCard]
    _threads: dict[str, stored.StoredThread]

    def announce(self, card: WorkerCard, forget_before: datetime) -> None:
        with self._lock:
            self._cards[card.worker_id] = card
            for worker_id in [w for w, c in self._cards.items() if c.seen_at < forget_before]:
                del self._cards[worker_id]

    def roster(self) -> list[WorkerCard]:
        with self._lock:
            return list(self._cards.values())

    def open_threads_by_version(self) -> dict[tuple[str, str], int]:
        with self._lock:
            infos = [stored.info_of(t) for t in self._threads.values()]
        return dict(
            Counter((i.agent, i.code_version) for i in infos if i.status is not ThreadStatus.CLOSED)
        )
