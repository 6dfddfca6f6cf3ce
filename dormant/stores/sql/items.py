"""A small cache of recently read, decoded history items, so a busy thread's slice reads
and decodes only the items committed since its last one (JSON and pydantic decoding of a
whole history every slice cost more than the slice's other SQL).

It is sound because a thread's items are append-only and move its version: every item is
written by the commit (or creation) that moves the thread to a new version, with a ``seq``
above every earlier item's. So the items read in a snapshot where the thread had version
``v`` are exactly the items a later snapshot holds up to the greatest ``seq`` read, and a
cached entry serves any snapshot whose thread version is at least ``v`` (and whose thread
is the same one: a pruned and re-created id has another ``created_at``). Everything else
reads the table as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from dormant.stores.base import StoredItem, ThreadInfo

__all__ = ["ITEM_CACHE_THREADS", "ItemCache"]

ITEM_CACHE_THREADS = 64
"""Threads whose decoded items a store keeps (least recently used out first)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    created_at: datetime
    version: int
    items: tuple[StoredItem, ...]


class ItemCache:
    """Decoded items per thread, least recently used evicted; safe across threads."""

    def __init__(self, max_threads: int = ITEM_CACHE_THREADS) -> None:
        self._max_threads = max_threads
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def known(self, thread: ThreadInfo) -> tuple[StoredItem, ...]:
        """The cached items valid in a snapshot where ``thread`` is as given (maybe none)."""
        with self._lock:
            entry = self._entries.get(thread.id)
            if entry is None:
                return ()
            if entry.created_at != thread.created_at or entry.version > thread.version:
                return ()
            self._entries.move_to_end(thread.id)
            return entry.items

    def keep(self, thread: ThreadInfo, items: tuple[StoredItem, ...]) -> None:
        """Remember all of ``thread``'s items as read in a snapshot where it is as given."""
        if self._max_threads <= 0:
            return
        with self._lock:
            entry = self._entries.get(thread.id)
            if entry is not None and entry.version > thread.version:
                return  # a newer snapshot's read is already here
            self._entries[thread.id] = _Entry(thread.created_at, thread.version, items)
            self._entries.move_to_end(thread.id)
            while len(self._entries) > self._max_threads:
                self._entries.popitem(last=False)

    def forget(self, thread_ids: list[str]) -> None:
        with self._lock:
            for thread_id in thread_ids:
                self._entries.pop(thread_id, None)
