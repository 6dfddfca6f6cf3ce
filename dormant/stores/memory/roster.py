"""The in-memory store's roster of workers: the cards of the processes that run agents."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime

from dormant.errors import UnknownThread
from dormant.stores.base import Commit, ThreadStatus, VersionSpan, WorkerCard
from dormant.stores.memory import thread as stored
from dormant.stores.records import version_spans

__all__ = ["MemoryRoster"]


class MemoryRoster:
    """``WorkerRoster`` under the store's lock; mixed into ``MemoryStore``."""

    _lock: threading.RLock
    _cards: dict[str, WorkerCard]
    _threads: dict[str, stored.StoredThread]
    _version_changes: dict[str, list[tuple[int, str, str, datetime]]]
    """Per thread a deploy met: (from_seq, code_version, previous, at) each time; a thread
    one version ran has no entry (an idle agent costs nothing more)."""

    def announce(self, card: WorkerCard, forget_before: datetime) -> None:
        with self._lock:
            self._cards[card.worker_id] = card
            for worker_id in [w for w, c in self._cards.items() if c.seen_at < forget_before]:
                del self._cards[worker_id]

    def roster(self) -> list[WorkerCard]:
        with self._lock:
            return list(self._cards.values())

    def _change_version(self, commit: Commit, now: datetime) -> None:
        """Keep ``commit.version_change`` (under the lock, with the commit): a second one
        at the same seq (a slice that added no item) keeps the later version."""
        change = commit.version_change
        assert change is not None
        kept = self._version_changes.setdefault(commit.thread_id, [])
        if kept and kept[-1][0] == change.from_seq:
            kept[-1] = (change.from_seq, commit.code_version, kept[-1][2], now)
        else:
            kept.append((change.from_seq, commit.code_version, change.previous, now))

    def version_spans(self, thread_id: str) -> list[VersionSpan]:
        with self._lock:
            if thread_id not in self._threads:
                raise UnknownThread(thread_id)
            info = stored.info_of(self._threads[thread_id])
            kept = list(self._version_changes.get(thread_id, ()))
        return version_spans(info, kept)

    def open_threads_by_version(self) -> dict[tuple[str, str], int]:
        with self._lock:
            infos = [stored.info_of(t) for t in self._threads.values()]
        return dict(
            Counter((i.agent, i.code_version) for i in infos if i.status is not ThreadStatus.CLOSED)
        )
