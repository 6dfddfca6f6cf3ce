"""Assemble a thread's model-visible history from its own items and its ancestors'.

A child stores only its own items and inherits its parent's history up to ``fork_seq``
by reference, recursively. Seqs continue along a lineage (a child's first own seq is
``fork_seq + 1``), so one number orders everything a thread sees. A ``Summary`` is an
ordinary item at its own position that stands for everything up to ``upto_seq``: a
child spawned before a compaction forks below the summary's position and so never sees
it, which keeps what it inherited exact.

A fork (``runtime/forks.py``) inherits the same way from its ``source_id``: the walk goes
up whichever of the two a thread has. A fork may be made below its source's own fork
point, so each step reads an ancestor up to the lowest limit met on the way.
"""

from __future__ import annotations

from typing import Protocol

from dormant.messages import Summary
from dormant.stores.base import StoredItem, ThreadInfo
from dormant.stores.rawitem import item_kind

__all__ = [
    "OwnItems",
    "TailItems",
    "full_history",
    "inherits_from",
    "next_seq",
    "tail",
    "visible_history",
]


class OwnItems(Protocol):
    def thread(self, thread_id: str) -> ThreadInfo: ...

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]: ...


class TailItems(Protocol):
    def thread(self, thread_id: str) -> ThreadInfo: ...

    def own_items_between(
        self, thread_id: str, after_seq: int, upto_seq: int
    ) -> list[StoredItem]: ...


def inherits_from(thread: ThreadInfo) -> str | None:
    """The thread whose history ``thread`` continues: a child's parent, a fork's source."""
    return thread.parent_id if thread.parent_id is not None else thread.source_id


def _lower(limit: int | None, fork_seq: int | None) -> int | None:
    """The limit to read the next ancestor with: its descendant's fork point, or a lower
    limit met further down (a fork made below its source's own fork point)."""
    fork = fork_seq or 0
    return fork if limit is None else min(limit, fork)


def visible_history(reader: OwnItems, thread: ThreadInfo) -> list[StoredItem]:
    """The history a model sees for ``thread``: ancestors' prefixes, then the latest
    summary (if any) followed by every item after what it covers."""
    segments: list[list[StoredItem]] = []
    current: ThreadInfo | None = thread
    limit: int | None = None
    while current is not None:
        own = reader.own_items(current.id, limit)
        segments.append(own)
        summary = _last_summary(own)
        if summary is not None and summary.upto_seq >= (current.fork_seq or 0):
            break  # this summary covers everything inherited: no need to read ancestors
        ancestor = inherits_from(current)
        if ancestor is None:
            break
        limit = _lower(limit, current.fork_seq)
        current = reader.thread(ancestor)
    raw = [item for segment in reversed(segments) for item in segment]
    return compacted(raw)


def full_history(reader: OwnItems, thread: ThreadInfo) -> list[StoredItem]:
    """Everything ``thread``'s history holds, uncompacted: the ancestors' items up to each
    fork, then its own, in order; items a summary replaced are kept, and each summary sits
    where it was made. What a person reads to audit a thread, not what its model sees."""
    segments: list[list[StoredItem]] = []
    current, limit = thread, None
    while True:
        segments.append(reader.own_items(current.id, limit))
        ancestor = inherits_from(current)
        if ancestor is None:
            break
        limit = _lower(limit, current.fork_seq)
        current = reader.thread(ancestor)
    return [item for segment in reversed(segments) for item in segment]


def tail(reader: TailItems, thread: ThreadInfo, upto_seq: int, count: int) -> list[StoredItem]:
    """The last ``count`` items at or before ``upto_seq`` of ``thread``'s uncompacted
    lineage, in order: what a fork reads around its fork point, in time and bytes that
    do not grow with the history (seqs are dense along a lineage)."""
    segments: list[list[StoredItem]] = []
    current, limit, floor = thread, upto_seq, upto_seq - count
    while limit > floor:
        fork = current.fork_seq or 0
        segments.append(reader.own_items_between(current.id, max(floor, fork), limit))
        ancestor = inherits_from(current)
        if ancestor is None or fork <= floor:
            break
        limit = min(limit, fork)
        current = reader.thread(ancestor)
    return [item for segment in reversed(segments) for item in segment]


def next_seq(thread: ThreadInfo, visible: list[StoredItem]) -> int:
    """The seq of the thread's next own item. Own items are those past ``fork_seq``, and
    the newest of them is always visible (a summary never hides what comes after it)."""
    fork = thread.fork_seq or 0
    return max((s.seq for s in visible if s.seq > fork), default=fork) + 1


def compacted(raw: list[StoredItem]) -> list[StoredItem]:
    """``raw`` as the model sees it: the latest summary first, then what it does not cover."""
    # By kind: a raw item (``stores/rawitem.py``) tells its kind without being decoded.
    last = next((s for s in reversed(raw) if item_kind(s) == "summary"), None)
    if last is None:
        return raw
    upto = last.item.upto_seq  # type: ignore[union-attr]
    rest = [s for s in raw if s.seq > upto and item_kind(s) != "summary"]
    return [last, *rest]


def _last_summary(items: list[StoredItem]) -> Summary | None:
    for stored in reversed(items):
        if item_kind(stored) == "summary":
            return stored.item  # type: ignore[return-value]
    return None
