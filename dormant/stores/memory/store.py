"""The in-memory store: the whole ``Store`` contract in one process, no server.

An idle thread is kept compact, as bytes, not object graphs, so a hundred thousand idle
agents cost little more than their compressed text: its items as compressed lines of JSON
(``blob.ItemLog``, read back undecoded: ``stores/rawitem.py``); its info, calls and last
finished inbox rows as JSON packed with a preset dictionary of their framing
(``packing.pack``); the ids it has seen as 8-byte digests. Finished inbox rows are kept only
for the last ``thread.DONE_ROWS_KEPT`` per thread; the dedup set keeps every id.

A thread in use is "hot": decoded once into objects that slices read and commits
update, and written back to bytes when it cools. A thread cools when a commit leaves it
idle or closed (its turn is over; it waits for a person, so keeping it decoded would
cost memory for nothing) or when it is the least recently used of more than
``max_hot_threads`` hot threads. A thread waiting on a tool stays hot: its result usually
comes soon, and its next slice then decodes nothing. Pending inbox rows, outbox rows and
timers are few and short-lived, so they stay as objects.

The rest is mixed in, under the same lock: closing (``closing.py``), quarantine and
retention (``retention.py``), spend and usage (``ledger.py``), timers, outbox rows and what
the sweeper asks (``sweep.py``).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import replace
from datetime import datetime
from typing import Any

from dormant.errors import (
    CallAnswered,
    DuplicateMessage,
    InboxFull,
    SchemaMismatch,
    SubscriptionCancelled,
    ThreadClosed,
    UnknownCall,
    UnknownThread,
)
from dormant.messages import Inbound
from dormant.stores.base import (
    CallRecord,
    CallState,
    Commit,
    InboxRow,
    InboxState,
    NewThread,
    NewTimer,
    OutboxRow,
    Snapshot,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
    TimerRow,
    WorkerCard,
)
from dormant.stores.lineage import next_seq, visible_history
from dormant.stores.memory import thread as stored
from dormant.stores.memory.blob import ITEM_FRAMING, unpack_lines
from dormant.stores.memory.closing import MemoryClosing
from dormant.stores.memory.ledger import MemoryLedger, MemorySpending
from dormant.stores.memory.retention import MemoryRetention, _waiting
from dormant.stores.memory.roster import MemoryRoster
from dormant.stores.memory.sweep import MemorySweep
from dormant.stores.memory.timers import MemoryTimerQuery
from dormant.stores.rawitem import item_line, parse_lines

__all__ = ["MemoryStore"]


class MemoryStore(
    MemoryClosing, MemoryRetention, MemorySpending, MemorySweep, MemoryRoster, MemoryTimerQuery
):
    """``Store`` in memory; thread-safe behind one lock."""

    def __init__(self, max_hot_threads: int = 256) -> None:
        self._lock = threading.RLock()
        self._threads: dict[str, stored.StoredThread] = {}
        self._hot: OrderedDict[str, stored.StoredThread] = OrderedDict()
        """Decoded threads, least recently used first."""
        self._max_hot = max_hot_threads
        self._open: dict[str, dict[int, InboxRow]] = {}
        """Pending and deferred inbox rows by thread, in id order (ids only grow)."""
        self._outbox: dict[int, OutboxRow] = {}
        self._call_traces: dict[tuple[str, str], str] = {}
        """The trace context of traced calls whose rows ran (a deferred tool's result may
        come later): nothing is kept untraced."""
        self._cards: dict[str, WorkerCard] = {}
        self._version_changes: dict[str, list[tuple[int, str, str, datetime]]] = {}
        self._timers: dict[int, TimerRow] = {}
        self._timer_heap: list[tuple[datetime, int]] = []
        self._timer_keys: set[tuple[str, str]] = set()
        self._ids = itertools.count(1)
        self._children: dict[str, list[str]] = {}
        self._forks: dict[str, list[str]] = {}
        """Forks by source: retention keeps a source while a fork of it lives."""
        self._ledger = MemoryLedger()

    # threads ---------------------------------------------------------------------------

    def create_thread(self, thread: NewThread) -> ThreadInfo:
        with self._lock:
            if thread.id in self._threads:
                raise DuplicateMessage(thread.id, thread.id)
            now = stored.now()
            info = ThreadInfo(
                id=thread.id,
                agent=thread.agent,
                status=thread.status,
                version=0,
                created_at=now,
                updated_at=now,
                parent_id=thread.parent_id,
                parent_call_id=thread.parent_call_id,
                fork_seq=thread.fork_seq,
                root_id=thread.root_id or thread.id,
                metadata=dict(thread.metadata),
                source_id=thread.source_id,
                tag=thread.tag,
                retry_at=thread.retry_at,
            )
            t = stored.stored_thread(info)
            t.log.append(b"".join(map(item_line, thread.items)))
            if len(t.log.tail) >= stored.FOLD_BYTES:  # made with a history (a fork's own
                t.log.fold(ITEM_FRAMING)  # items are few): compressed, as a cooled one's
            if thread.calls:
                t.calls = stored.pack_calls({c.call_id: c for c in thread.calls})
            for message_id, message, priority in thread.messages:
                self._insert_row(t, thread.id, message_id, message, priority, thread.trace)
            self._threads[thread.id] = t
            if thread.parent_id is not None:
                self._children.setdefault(thread.parent_id, []).append(thread.id)
            if thread.source_id is not None:
                self._forks.setdefault(thread.source_id, []).append(thread.id)
            return info

    def thread(self, thread_id: str) -> ThreadInfo:
        with self._lock:
            return stored.info_of(self._get(thread_id))

    def check_schema(self, *, at_start: bool = False) -> SchemaMismatch | None:
        return None  # memory has no schema to be behind

    def threads(
        self,
        status: ThreadStatus | None = None,
        limit: int = 100,
        *,
        agent: str | None = None,
        before: tuple[datetime, str] | None = None,
        tag: str | None = None,
    ) -> list[ThreadInfo]:
        with self._lock:
            infos = [
                stored.info_of(t)
                for t in self._threads.values()
                if status is None or stored.status_of(t) is status
            ]
        infos = [
            i
            for i in infos
            if (agent is None or i.agent == agent)
            and (tag is None or i.tag == tag)
            and (before is None or (i.created_at, i.id) < before)
        ]
        infos.sort(key=lambda i: (i.created_at, i.id), reverse=True)
        return infos[:limit]

    def set_status(self, thread_id: str, status: ThreadStatus) -> ThreadInfo:
        with self._lock:
            t = self._get(thread_id)
            return stored.update(
                t, status=status, failures=0, last_error="", retry_at=None, message_completions=0
            )

    def set_metadata(self, thread_id: str, metadata: dict[str, Any]) -> ThreadInfo:
        with self._lock:
            return stored.update(self._get(thread_id), metadata=dict(metadata))

    # inbox ----------------------------------------------------------------------------

    def enqueue(
        self,
        thread_id: str,
        message_id: str,
        message: Inbound,
        priority: int,
        *,
        max_open: int | None = None,
        answered_ok: bool = True,
        trace: str = "",
    ) -> InboxRow:
        with self._lock:
            t = self._get(thread_id)
            info = stored.info_of(t)
            if info.status is ThreadStatus.CLOSED:
                raise ThreadClosed(thread_id, info.closed_reason)
            if max_open is not None and not t.seen(message_id):
                depth = sum(1 for r in self._open.get(thread_id, {}).values() if _waiting(r))
                if depth >= max_open:
                    raise InboxFull(thread_id, depth)
            call_id = getattr(message, "call_id", None)
            if call_id is not None:
                call = stored.calls_of(t).get(call_id)
                if call is None:
                    raise UnknownCall(thread_id, call_id)
                if call.state is CallState.CANCELLED:
                    raise SubscriptionCancelled(thread_id, call_id)
                answered = call.state is CallState.ANSWERED and not call.subscription
                if answered and not answered_ok:
                    if t.seen(message_id):
                        raise DuplicateMessage(thread_id, message_id)
                    raise CallAnswered(thread_id, call_id, message_id)
            return self._insert_row(t, thread_id, message_id, message, priority, trace)

    def add_timer(self, thread_id: str, timer: NewTimer) -> None:
        with self._lock:
            self._get(thread_id)
            self._add_timer(thread_id, timer)

    # slice ----------------------------------------------------------------------------

    def load(self, thread_id: str) -> Snapshot:
        with self._lock:
            hot = self._heat(thread_id, self._get(thread_id))
            inbox = [r for r in self._open.get(thread_id, {}).values() if _waiting(r)]
            items = visible_history(self, hot.info)
            return Snapshot(hot.info, items, dict(hot.calls), inbox, next_seq(hot.info, items))

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
        with self._lock:
            t = self._get(thread_id)
            items = list(t.hot.items) if t.hot is not None else stored.decode_items(t)[0]
        return items if upto_seq is None else [i for i in items if i.seq <= upto_seq]

    def own_items_between(self, thread_id: str, after_seq: int, upto_seq: int) -> list[StoredItem]:
        with self._lock:
            t = self._get(thread_id)
            if t.hot is not None:
                items: list[StoredItem] | list[bytes] = list(t.hot.items)
            else:  # a cold thread's log: inflate its last segments, parse only the window
                head = t.log.head()
                first = int(head.split(b"\t", 1)[0]) if head else 0
                items = t.log.text_from(after_seq + 1 - first).split(b"\n")[:-1]
        # Seqs are dense from the first own item on: the window is a slice, not a scan.
        first = _seq_of(items[0]) if items else 0
        start, stop = max(0, after_seq + 1 - first), max(0, upto_seq + 1 - first)
        found = [i if isinstance(i, StoredItem) else parse_lines(i)[0] for i in items[start:stop]]
        return [i for i in found if after_seq < i.seq <= upto_seq]

    def children(self, thread_id: str) -> list[ThreadInfo]:
        with self._lock:
            self._get(thread_id)
            kids = [stored.info_of(self._threads[c]) for c in self._children.get(thread_id, ())]
        return sorted(kids, key=lambda i: (i.created_at, i.id))

    def commit(self, commit: Commit) -> list[OutboxRow] | None:
        with self._lock:
            t = self._get(commit.thread_id)
            hot = self._heat(commit.thread_id, t)
            info = hot.info
            if info.version != commit.version:
                return None
            for new in commit.threads:  # validate before writing: a commit is all or nothing
                if new.id in self._threads:
                    raise DuplicateMessage(new.id, new.id)
            hot.items += commit.items
            hot.unsaved += len(commit.items)
            hot.calls.update({c.call_id: c for c in commit.calls})
            hot.dirty = True
            open_rows = self._open.get(commit.thread_id, {})
            for row_id in commit.done:
                stored.finish(hot, open_rows, row_id, InboxState.DONE, "", commit.trace)
            for row_id, reason in commit.rejected:
                stored.finish(hot, open_rows, row_id, InboxState.REJECTED, reason)
            for row_id in commit.deferred:
                if row_id in open_rows:
                    open_rows[row_id] = replace(open_rows[row_id], state=InboxState.DEFERRED)
            if not open_rows:
                self._open.pop(commit.thread_id, None)
            now = stored.now()
            created = []
            for call_id, action in commit.outbox:
                row = OutboxRow(
                    next(self._ids), commit.thread_id, call_id, action, now, trace=commit.trace
                )
                self._outbox[row.id] = row
                created.append(row)
            for timer in commit.timers:
                self._add_timer(commit.thread_id, timer)
            self._cancel_timers(commit.thread_id, set(commit.cancel_timers))
            for new in commit.threads:
                self.create_thread(new)
            if commit.close_descendants:
                created += self._close_descendants(commit.thread_id, now)
            for thread_id, message_id, message, priority in commit.enqueue:
                target = self._threads.get(thread_id)
                if target is not None and not target.seen(message_id):
                    self._insert_row(target, thread_id, message_id, message, priority, commit.trace)
            changes: dict[str, Any] = dict(
                status=commit.status,
                inbox_seen=max(info.inbox_seen, commit.inbox_seen),
                failures=0,
                last_error="",
                retry_at=None,
            )
            if commit.usage is not None:
                changes["usage"] = commit.usage
            if commit.closed_reason:
                changes["closed_reason"] = commit.closed_reason
            if commit.code_version:
                changes["code_version"] = commit.code_version
            if commit.version_change is not None:
                self._change_version(commit, now)
            if commit.spend is not None:
                changes["message_completions"] = commit.message_completions or 0
                self._add_spend(info, commit.spend, now, changes)
            stored.update(t, **changes)
            if commit.status in (ThreadStatus.IDLE, ThreadStatus.CLOSED):
                self._cool(commit.thread_id, t)  # its turn is over: it waits for a person
            return created

    def defer(self, thread_id: str, not_before: datetime, *, seen: int) -> None:
        with self._lock:
            t = self._get(thread_id)
            inbox_seen = max(stored.info_of(t).inbox_seen, seen)
            stored.update(t, retry_at=not_before, inbox_seen=inbox_seen)

    def record_failure(
        self, thread_id: str, error: str, stall_after: int, retry_at: datetime | None = None
    ) -> ThreadInfo:
        with self._lock:
            t = self._get(thread_id)
            info = stored.info_of(t)
            failures = info.failures + 1
            status = ThreadStatus.STALLED if failures >= stall_after else info.status
            return stored.update(
                t, failures=failures, last_error=error, status=status, retry_at=retry_at
            )

    def has_pending_after(
        self, thread_id: str, inbox_id: int, *, user_text_only: bool = False
    ) -> bool:
        with self._lock:
            return any(
                r.id > inbox_id
                and r.state is InboxState.PENDING
                and (not user_text_only or r.message.kind == "user")
                for r in self._open.get(thread_id, {}).values()
            )

    # queries --------------------------------------------------------------------------

    def history(self, thread_id: str) -> list[StoredItem]:
        with self._lock:
            return visible_history(self, stored.info_of(self._get(thread_id)))

    def call(self, thread_id: str, call_id: str) -> CallRecord:
        with self._lock:
            call = stored.calls_of(self._get(thread_id)).get(call_id)
        if call is None:
            raise UnknownCall(thread_id, call_id)
        return call

    def call_trace(self, thread_id: str, call_id: str) -> str:
        with self._lock:  # a scan: asked only while tracing, for a result sent from outside
            rows = [
                r for r in self._outbox.values() if (r.thread_id, r.call_id) == (thread_id, call_id)
            ]
            if rows:
                return max(rows, key=lambda r: r.id).trace
            return self._call_traces.get((thread_id, call_id), "")

    def inbox(self, thread_id: str, state: InboxState | None = None) -> list[InboxRow]:
        with self._lock:
            t = self._get(thread_id)
            if t.hot is not None:
                lines = t.hot.done
            else:
                lines = unpack_lines(t.done, stored.framings().rows)
            rows = [stored.codecs().row.validate_json(line) for line in lines]
            rows += self._open.get(thread_id, {}).values()
        rows.sort(key=lambda r: r.id)
        return [r for r in rows if state is None or r.state is state]

    def stored_bytes(self, thread_id: str) -> int:
        """The bytes this store keeps for one idle thread (cooled first)."""
        with self._lock:
            t = self._get(thread_id)
            self._cool(thread_id, t)
            return len(t.info) + t.log.nbytes() + len(t.calls) + t.ids.nbytes() + len(t.done)

    def close(self) -> None:
        pass

    # the DedupSet protocol: the store's own durable set, exact and never forgetting ------

    def seen(self, thread_id: str, message_id: str) -> bool:
        with self._lock:
            t = self._threads.get(thread_id)
            return t is not None and t.seen(message_id)

    def add(self, thread_id: str, message_ids: list[str]) -> None:
        """Nothing to do: ``enqueue`` records every id it accepts."""

    # internals ------------------------------------------------------------------------

    def _get(self, thread_id: str) -> stored.StoredThread:
        t = self._threads.get(thread_id)
        if t is None:
            raise UnknownThread(thread_id)
        return t

    def _heat(self, thread_id: str, t: stored.StoredThread) -> stored.Hot:
        """The thread decoded, most recently used; the least recently used cools."""
        if t.hot is not None:
            self._hot.move_to_end(thread_id)
            return t.hot
        hot = stored.heat(t)
        self._hot[thread_id] = t
        while len(self._hot) > self._max_hot:
            oldest, cold = next(iter(self._hot.items()))
            self._cool(oldest, cold)
        return hot

    def _cool(self, thread_id: str, t: stored.StoredThread) -> None:
        """Write the decoded thread back to bytes and drop the objects."""
        stored.cool(t)
        self._hot.pop(thread_id, None)

    def _insert_row(
        self,
        t: stored.StoredThread,
        thread_id: str,
        message_id: str,
        message: Inbound,
        priority: int,
        trace: str = "",
    ) -> InboxRow:
        if t.seen(message_id):
            raise DuplicateMessage(thread_id, message_id)
        row = InboxRow(
            next(self._ids),
            thread_id,
            message_id,
            message,
            priority,
            InboxState.PENDING,
            stored.now(),
            trace=trace,
        )
        t.ids.add(message_id)
        self._open.setdefault(thread_id, {})[row.id] = row
        return row


def _seq_of(item: StoredItem | bytes) -> int:
    """The seq of an item, or of an item log's line (``rawitem.item_line``)."""
    return item.seq if isinstance(item, StoredItem) else int(item.split(b"\t", 1)[0])
