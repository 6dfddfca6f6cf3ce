"""Quarantine and retention for the in-memory store, kept apart from its hot paths.

``MemoryRetention`` is mixed into ``MemoryStore``: it reads the store's structures (its
lock, threads, open inbox rows, outbox and timers) under the same lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from datetime import datetime

from dormant.stores.base import (
    RETRIED_MARK,
    InboxRow,
    InboxState,
    OutboxRow,
    PruneCounts,
    ThreadInfo,
    ThreadStatus,
    TimerRow,
)
from dormant.stores.memory.blob import pack_lines, unpack_lines
from dormant.stores.memory.ledger import MemoryLedger
from dormant.stores.memory.thread import StoredThread, codecs, framings, info_of, update

__all__ = ["MemoryRetention"]


def _waiting(row: InboxRow) -> bool:
    """A row a slice still has to decide on (pending or deferred; not quarantined)."""
    return row.state is InboxState.PENDING or row.state is InboxState.DEFERRED


class MemoryRetention:
    _lock: threading.RLock
    _threads: dict[str, StoredThread]
    _version_changes: dict[str, list[tuple[int, str, str, datetime]]]
    _hot: OrderedDict[str, StoredThread]
    _open: dict[str, dict[int, InboxRow]]
    _outbox: dict[int, OutboxRow]
    _call_traces: dict[tuple[str, str], str]
    _timers: dict[int, TimerRow]
    _timer_keys: set[tuple[str, str]]
    _children: dict[str, list[str]]
    _forks: dict[str, list[str]]
    _ledger: MemoryLedger

    def _get(self, thread_id: str) -> StoredThread:
        raise NotImplementedError

    def quarantine(self, thread_id: str, inbox_id: int, reason: str) -> ThreadInfo:
        with self._lock:
            t = self._get(thread_id)
            rows = self._open.get(thread_id, {})
            row = rows.get(inbox_id)
            if row is not None and _waiting(row):
                rows[inbox_id] = replace(row, state=InboxState.QUARANTINED, reason=reason)
            return update(t, failures=0, retry_at=None)

    def release_quarantined(self, thread_id: str, message_id: str | None = None) -> list[InboxRow]:
        with self._lock:
            self._get(thread_id)
            rows = self._open.get(thread_id, {})
            released = []
            for row in list(rows.values()):
                if row.state is not InboxState.QUARANTINED:
                    continue
                if message_id is None or row.message_id == message_id:
                    reason = RETRIED_MARK + row.reason
                    rows[row.id] = replace(row, state=InboxState.PENDING, reason=reason)
                    released.append(rows[row.id])
            return released

    def quarantined(self, limit: int = 100) -> list[InboxRow]:
        with self._lock:
            rows = [
                r
                for open_rows in self._open.values()
                for r in open_rows.values()
                if r.state is InboxState.QUARANTINED
            ]
        return sorted(rows, key=lambda r: r.id)[:limit]

    def prune_batch(
        self, older_than: datetime, limit: int, *, dry_run: bool = False
    ) -> PruneCounts:
        with self._lock:
            trees = [
                tree
                for thread_id, t in self._threads.items()
                if self._prunable_top(info_of(t), older_than)
                and (tree := self._prunable_tree(thread_id, older_than)) is not None
            ]
            if not dry_run:
                trees = trees[:limit]
            doomed = {thread_id for tree in trees for thread_id in tree}
            in_trees = self._rows_of(doomed)  # counted, as deleted, with their threads
            if not dry_run:
                for tree in trees:
                    self._delete_tree(tree)
            finished = 0
            for thread_id, t in self._threads.items():
                if thread_id in doomed:  # a dry run: counted with its tree
                    continue
                kept: list[bytes] = []
                lines = t.hot.done if t.hot is not None else unpack_lines(t.done, framings().rows)
                for line in lines:
                    room = dry_run or finished < limit
                    if room and codecs().row.validate_json(line).created_at < older_than:
                        finished += 1
                        if not dry_run:
                            continue
                    kept.append(line)
                if dry_run or len(kept) == len(lines):
                    continue
                if t.hot is not None:
                    t.hot.done = kept
                    t.hot.dirty = True
                else:
                    t.done = pack_lines(kept, framings().rows)
            # Ran outbox rows and fired timers are not kept in memory at all.
            return in_trees + PruneCounts(inbox=finished)

    def _prunable_top(self, info: ThreadInfo, older_than: datetime) -> bool:
        """A root, or a closed thread under an open parent that has applied everything it
        sent (no waiting or quarantined row of the parent older than its last change)."""
        if info.parent_id is None:
            return True
        if info.status is not ThreadStatus.CLOSED or info.updated_at >= older_than:
            return False
        parent = self._threads.get(info.parent_id)
        if parent is None or info_of(parent).status is ThreadStatus.CLOSED:
            return False  # inside a closed subtree: its own top prunes it
        rows = self._open.get(info.parent_id, {}).values()
        return not any(
            (_waiting(r) or r.state is InboxState.QUARANTINED) and r.created_at <= info.updated_at
            for r in rows
        )

    def _prunable_tree(self, root_id: str, older_than: datetime) -> list[str] | None:
        """The thread ids of the tree under ``root_id`` (a root, or a thread under an open
        parent) if every one is closed and older."""
        tree, todo = [], [root_id]
        while todo:
            thread_id = todo.pop()
            info = info_of(self._threads[thread_id])
            if info.status is not ThreadStatus.CLOSED or info.updated_at >= older_than:
                return None
            if any(f in self._threads for f in self._forks.get(thread_id, ())):
                return None  # a fork still reads its items: the source goes after it
            tree.append(thread_id)
            todo += self._children.get(thread_id, ())
        return tree

    def _rows_of(self, doomed: set[str]) -> PruneCounts:
        """What deleting the threads ``doomed`` deletes: the threads, every inbox row
        (finished or not), outbox row and timer of theirs."""
        inbox = 0
        for thread_id in doomed:
            t = self._threads[thread_id]
            done = t.hot.done if t.hot is not None else unpack_lines(t.done, framings().rows)
            inbox += len(done) + len(self._open.get(thread_id, {}))
        return PruneCounts(
            threads=len(doomed),
            inbox=inbox,
            outbox=sum(r.thread_id in doomed for r in self._outbox.values()),
            timers=sum(r.thread_id in doomed for r in self._timers.values()),
        )

    def _delete_tree(self, tree: list[str]) -> None:
        doomed = set(tree)
        top = info_of(self._threads[tree[0]]).parent_id
        if top is not None and top in self._children:  # a subtree: its parent lives on
            self._children[top] = [c for c in self._children[top] if c not in doomed]
        for thread_id in tree:
            self._threads.pop(thread_id, None)
            self._version_changes.pop(thread_id, None)
            self._hot.pop(thread_id, None)
            self._open.pop(thread_id, None)
            self._children.pop(thread_id, None)
            self._forks.pop(thread_id, None)
        for row_id in [i for i, r in self._outbox.items() if r.thread_id in doomed]:
            del self._outbox[row_id]
        for key in [k for k in self._call_traces if k[0] in doomed]:
            del self._call_traces[key]
        for timer_id in [i for i, r in self._timers.items() if r.thread_id in doomed]:
            del self._timers[timer_id]
        self._timer_keys = {k for k in self._timer_keys if k[0] not in doomed}
        self._ledger.drop(doomed)
