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

The cache is bounded by the items' JSON bytes, not by a count of threads: a worker keeps
every thread it serves in turn while they fit. A count of 64 threads made every slice of a
wave of 200 agents read and unpack its whole history again (``bench/workload.py
dormant-sqlite --waves 200``: 241 completions per CPU-second, against 419 with all 200
cached). An entry costs about its JSON again in objects, and its decoded items once a
model has read them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from dormant.stores.base import StoredItem, ThreadInfo
from dormant.stores.rawitem import item_json

__all__ = ["ITEM_CACHE_BYTES", "ItemCache"]

ITEM_CACHE_BYTES = 8 * 1024 * 1024
"""The items' JSON a store keeps, in bytes (least recently used thread out first), unless
told otherwise (``Settings.history_cache_mib``): about 140 threads of 20 turns of model
text. Chosen from ``bench/history_cache.py``'s curve (docs/benchmarks.md): on SQLite, 300
agents in waves of 100, 8 MiB ran 0.99 of 32 MiB's completions per CPU-second with 40 %
of its memory per idle agent (39.6 KB against 99.9); 4 MiB, which held two thirds of a
wave, 0.86, no cache at all 0.82. It was 32 MiB (about 550 such threads)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    created_at: datetime
    version: int
    items: tuple[StoredItem, ...]
    nbytes: int


def _nbytes(items: tuple[StoredItem, ...]) -> int:
    return sum(len(item_json(s)) for s in items)


class ItemCache:
    """Decoded items per thread, least recently used evicted; safe across threads."""

    def __init__(self, max_bytes: int = ITEM_CACHE_BYTES) -> None:
        self._max_bytes = max_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._nbytes = 0
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

    def last_seq(self, thread_id: str) -> int | None:
        """The seq of the last item cached for ``thread_id``, if any, unchecked: what a read
        sent before the thread's row is known asks for (``loads.py``); ``known`` then says
        whether the entry serves the snapshot."""
        with self._lock:
            entry = self._entries.get(thread_id)
            return entry.items[-1].seq if entry is not None and entry.items else None

    def keep(self, thread: ThreadInfo, items: tuple[StoredItem, ...]) -> None:
        """Remember all of ``thread``'s items as read in a snapshot where it is as given."""
        if self._max_bytes <= 0:
            return
        # Items are measured once: those after the entry they extend, when they do.
        entry = self._entries.get(thread.id)
        known = 0 if entry is None else len(entry.items)
        if entry is not None and 0 < known <= len(items) and items[known - 1] is entry.items[-1]:
            nbytes = entry.nbytes + _nbytes(items[known:])
        else:
            nbytes = _nbytes(items)
        with self._lock:
            entry = self._entries.get(thread.id)
            if entry is not None and entry.version > thread.version:
                return  # a newer snapshot's read is already here
            self._drop(thread.id)
            if nbytes > self._max_bytes:
                return
            self._entries[thread.id] = _Entry(thread.created_at, thread.version, items, nbytes)
            self._nbytes += nbytes
            while self._nbytes > self._max_bytes:
                self._drop(next(iter(self._entries)))

    def forget(self, thread_ids: list[str]) -> None:
        with self._lock:
            for thread_id in thread_ids:
                self._drop(thread_id)

    def _drop(self, thread_id: str) -> None:
        entry = self._entries.pop(thread_id, None)
        if entry is not None:
            self._nbytes -= entry.nbytes
