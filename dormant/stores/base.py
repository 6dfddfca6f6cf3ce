"""The narrow protocols that keep the runtime's records (``stores/records.py``).

The slice needs only ``SliceStore``; clients need ``InboxStore`` and ``QueryStore``; the
sweeper needs ``SweepStore``. ``Store`` is all four, which every backend implements (memory,
SQLite, PostgreSQL) against one contract test suite. The records are handed on from here
too, so one import serves a backend or a caller.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from dormant.errors import SchemaMismatch
from dormant.messages import Inbound
from dormant.stores.records import (
    RETRIED_MARK,
    AgentCard,
    CallRecord,
    CallState,
    Commit,
    InboxRow,
    InboxState,
    NewThread,
    NewTimer,
    OutboxRow,
    Priority,
    PruneCounts,
    Snapshot,
    Spend,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
    TimerRow,
    VersionChange,
    VersionSpan,
    WorkerCard,
)

__all__ = [
    "RETRIED_MARK",
    "AgentCard",
    "CallRecord",
    "CallState",
    "Commit",
    "DedupSet",
    "InboxRow",
    "InboxState",
    "InboxStore",
    "Lease",
    "NewThread",
    "NewTimer",
    "OutboxRow",
    "Priority",
    "PruneCounts",
    "QueryStore",
    "SliceStore",
    "Snapshot",
    "Spend",
    "Store",
    "StoredItem",
    "SweepStore",
    "ThreadInfo",
    "ThreadStatus",
    "TimerRow",
    "VersionChange",
    "VersionSpan",
    "WorkerCard",
    "WorkerRoster",
]


class SliceStore(Protocol):
    def load(self, thread_id: str) -> Snapshot:
        """The thread as a slice sees it; raises ``UnknownThread``."""
        ...

    def thread(self, thread_id: str) -> ThreadInfo:
        """The thread's record alone (a slice whose ``load`` failed records the failure)."""
        ...

    def commit(self, commit: Commit) -> list[OutboxRow] | None:
        """Write atomically; the new outbox rows, or None when ``version`` moved (stale)."""
        ...

    def record_failure(
        self, thread_id: str, error: str, stall_after: int, retry_at: datetime | None = None
    ) -> ThreadInfo:
        """Count a failed slice (nothing else changes); stall the thread at ``stall_after``;
        leave it to the sweeper only after ``retry_at``."""
        ...

    def mark_dispatched(self, outbox_ids: list[int]) -> None: ...

    def defer(self, thread_id: str, not_before: datetime, *, seen: int) -> None:
        """Leave the thread to the sweeper until ``not_before`` (its ``retry_at``) without
        counting a failure: admission found no model capacity (``runtime/admission.py``).
        ``seen`` is the newest inbox row the refused slice looked at, kept as the thread's
        ``inbox_seen`` (never lowered): only user text newer than it, sent after the
        deferral, is woken before ``not_before`` (user text deferred to its own turn
        waits for it)."""
        ...

    def quarantine(self, thread_id: str, inbox_id: int, reason: str) -> ThreadInfo:
        """Set an open inbox row aside (``QUARANTINED`` with ``reason``) and clear the
        thread's failures, so its other input goes on at once."""
        ...

    def children(self, thread_id: str) -> list[ThreadInfo]:
        """Direct children, oldest first."""
        ...

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
        """The thread's own items (a replay reads its source's transcript)."""
        ...

    def has_pending_after(
        self, thread_id: str, inbox_id: int, *, user_text_only: bool = False
    ) -> bool:
        """Whether a pending inbox row newer than ``inbox_id`` exists (arrived mid-slice),
        counting only user text if ``user_text_only`` (steering)."""
        ...


class InboxStore(Protocol):
    def create_thread(self, thread: NewThread) -> ThreadInfo:
        """Create a thread with its first messages; raises ``DuplicateMessage`` if the id
        exists (and then writes nothing)."""
        ...

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
        """Queue a message, with the sender's ``trace`` context kept on the row; raises
        ``UnknownThread``, ``ThreadClosed``, ``UnknownCall``,
        ``SubscriptionCancelled`` or ``DuplicateMessage`` (unique (thread_id, message_id),
        and a message id already in the history, whose inbox row retention may have
        deleted); ``InboxFull`` if ``max_open`` rows are already pending or deferred. Unless
        ``answered_ok``, a result for an answered call (not a subscription) raises
        ``DuplicateMessage`` if the thread has that message id, else ``CallAnswered``."""
        ...

    def release_quarantined(self, thread_id: str, message_id: str | None = None) -> list[InboxRow]:
        """Make the thread's quarantined rows (or the one with ``message_id``) pending
        again, their reason marked ``RETRIED_MARK``; the rows released."""
        ...

    def set_status(self, thread_id: str, status: ThreadStatus) -> ThreadInfo:
        """Force a status (``retry`` un-stalls a thread, resetting failures); bumps the version."""
        ...

    def add_timer(self, thread_id: str, timer: NewTimer) -> None:
        """A durable timer (``ToolContext.schedule``); a repeated message_id is ignored."""
        ...

    def set_metadata(self, thread_id: str, metadata: dict[str, Any]) -> ThreadInfo:
        """Replace the thread's metadata (``raise_budget``); bumps the version."""
        ...

    def call_trace(self, thread_id: str, call_id: str) -> str:
        """The trace context stored with the call's newest outbox row (the slice that made
        the call), "" if none: a deferred tool's result, delivered later from outside any
        span, goes on in its caller's trace (``docs/tracing.md``)."""
        ...


class QueryStore(Protocol):
    def thread(self, thread_id: str) -> ThreadInfo: ...

    def threads(
        self,
        status: ThreadStatus | None = None,
        limit: int = 100,
        *,
        agent: str | None = None,
        before: tuple[datetime, str] | None = None,
        tag: str | None = None,
    ) -> list[ThreadInfo]:
        """Threads newest first (by ``created_at``, then ``id``), of ``agent`` if given,
        with ``tag`` if given (``ThreadInfo.tag``: a replay's is ``replay:<its tag>``).

        ``before`` is the ``(created_at, id)`` of the last thread of a previous page: the
        page after it (keyset paging, as fast on the thousandth page as on the first)."""
        ...

    def history(self, thread_id: str) -> list[StoredItem]:
        """The model-visible history (inherited prefix, summaries, own items)."""
        ...

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
        """The thread's own stored items (no inheritance), up to ``upto_seq`` inclusive."""
        ...

    def own_items_between(self, thread_id: str, after_seq: int, upto_seq: int) -> list[StoredItem]:
        """The thread's own items with ``after_seq < seq <= upto_seq``, in order: a window
        read at the cost of its size, not of the history's (``lineage.tail``)."""
        ...

    def call(self, thread_id: str, call_id: str) -> CallRecord: ...

    def inbox(self, thread_id: str, state: InboxState | None = None) -> list[InboxRow]: ...

    def unfired_timers(
        self,
        message_prefix: str,
        *,
        root_id: str | None = None,
        agent: str | None = None,
        limit: int = 100,
    ) -> list[TimerRow]:
        """Timers not fired yet whose message id starts with ``message_prefix``, oldest
        first, of the threads in ``root_id``'s tree and of ``agent`` if given (the open
        approvals: ``runtime/approvals.py``)."""
        ...

    def quarantined(self, limit: int = 100) -> list[InboxRow]:
        """Quarantined rows of every thread, oldest first."""
        ...

    def usage(
        self,
        *,
        thread_id: str | None = None,
        agent: str | None = None,
        since: datetime | None = None,
    ) -> dict[str, Spend]:
        """The usage ledger summed per agent: of one thread, of one agent's threads, of
        the slices committed at or after ``since`` (pruned threads take theirs along)."""
        ...


class SweepStore(Protocol):
    def fire_due_timers(self, now: datetime, limit: int = 100) -> list[InboxRow]:
        """Turn due timers into inbox rows (stable message ids), marking them fired."""
        ...

    def undispatched(
        self, older_than: datetime, limit: int = 100, *, lost_before: datetime | None = None
    ) -> list[OutboxRow]:
        """Rows never dispatched and created before ``older_than``, and (with
        ``lost_before``) rows dispatched before it that no worker ever ran."""
        ...

    def mark_dispatched(self, outbox_ids: list[int]) -> None:
        """Stamp the dispatch time (again, for a re-dispatch) of rows not yet run."""
        ...

    def mark_ran(self, outbox_ids: list[int]) -> None:
        """A worker ran these rows: they are never dispatched again."""
        ...

    def claim_outbox(self, outbox_id: int, until: datetime) -> int:
        """A tool task starts the row, held until ``until``: the run's number (1 for the
        first), or 0 if the row ran or a live run holds it."""
        ...

    def unclaim_outbox(self, outbox_id: int) -> None:
        """Give back a claim whose run did not start the tool (this process lacks it): the
        claim is not counted as a run, and the row is undispatched again, so the next sweep
        sends it to the queue for any worker."""
        ...

    def renew_outbox_claim(self, outbox_id: int, until: datetime) -> bool:
        """The running task's heartbeat; False once the row ran."""
        ...

    def expired_claims(self, now: datetime, limit: int = 100) -> list[OutboxRow]:
        """Rows whose run stopped renewing its claim before ``now`` and never finished."""
        ...

    def reclaim_outbox(self, outbox_id: int, now: datetime) -> bool:
        """Take back a lapsed row (claim cleared, dispatched now): True for one caller."""
        ...

    def threads_to_wake(self, limit: int = 100, *, now: datetime | None = None) -> list[str]:
        """Threads (not stalled, not backing off at ``now``) with inbox rows in state
        pending, longest-waiting first. A thread deferred for model capacity (``defer``)
        is not backing off for user text sent after the deferral (an inbox id above its
        ``inbox_seen``)."""
        ...

    def wakes_due(self, limit: int = 100, *, now: datetime | None = None) -> list[tuple[str, int]]:
        """``threads_to_wake``, each with the highest priority among its pending rows: the
        priority its re-wake must have, so that user text whose own wake was lost is not
        queued behind background work."""
        ...

    def next_timer_due(self) -> datetime | None: ...

    def idle_threads(self, agent: str, idle_before: datetime, limit: int = 100) -> list[str]:
        """Threads of ``agent`` idle (status idle) since before ``idle_before``, by their
        last commit, longest idle first: what ``Agent(close_after_idle_s=...)`` closes."""
        ...

    def prune_batch(
        self, older_than: datetime, limit: int, *, dry_run: bool = False
    ) -> PruneCounts:
        """Delete, in short transactions of at most ``limit`` rows each: closed thread trees
        (a root and every descendant, all closed and untouched since ``older_than``) with
        everything they own; closed subtrees under an open parent that has applied what
        they sent it (no waiting or quarantined row of the parent older than the subtree
        top's last change); then finished inbox rows, ran outbox rows and fired timers
        older than ``older_than``. A pruned inbox row's message id stays a duplicate: in
        the history, or remembered by the store (SQL: a digest in ``pruned_ids``; memory:
        its digest set). The counts say what went: a deleted thread's inbox rows, outbox
        rows and timers count as rows too. ``dry_run`` deletes nothing and counts every
        candidate the same way (not one batch's worth)."""
        ...


class WorkerRoster(Protocol):
    """The processes that run agents, as they announced themselves (``WorkerCard``)."""

    def announce(self, card: WorkerCard, forget_before: datetime) -> None:
        """Store ``card`` (replacing the worker's last one) and drop the cards of workers
        not seen since ``forget_before``."""
        ...

    def roster(self) -> list[WorkerCard]:
        """Every card stored, live or not (``seen_at`` tells)."""
        ...

    def open_threads_by_version(self) -> dict[tuple[str, str], int]:
        """How many threads that are not closed each (agent, ``code_version``) has."""
        ...

    def version_spans(self, thread_id: str) -> list[VersionSpan]:
        """Which agent version ran the thread's slices, oldest first: one span when one
        version ran them all (``VersionSpan``)."""
        ...


class Store(SliceStore, InboxStore, QueryStore, SweepStore, WorkerRoster, Protocol):
    """Everything a backend provides."""

    def check_schema(self, *, at_start: bool = False) -> SchemaMismatch | None:
        """Refuse a database whose schema is older than this dormant's (``SchemaMismatch``);
        return one that is newer, to be said. ``at_start``: a database unreachable or not
        migrated yet is let through, and checked at the first transaction. A store with no
        schema (memory) has nothing to check."""
        ...

    def close(self) -> None: ...


class DedupSet(Protocol):
    """A lossy fast path for "was this message id seen?": SQL's unique key is the truth."""

    def seen(self, thread_id: str, message_id: str) -> bool: ...

    def add(self, thread_id: str, message_ids: list[str]) -> None: ...


class Lease(Protocol):
    """A per-thread lock with a time-to-live; the thread's version fences stale holders."""

    def acquire(self, thread_id: str, ttl_s: float) -> str | None:
        """A token if the lease was free, else None; a refusal is remembered for the
        holder's ``release``."""
        ...

    def renew(self, thread_id: str, token: str, ttl_s: float) -> bool: ...

    def release(self, thread_id: str, token: str) -> bool:
        """Release the lease if ``token`` holds it; whether an ``acquire`` was refused while
        it was held (that slice ended at once: the holder must drain what woke it)."""
        ...

    def held(self, thread_id: str) -> bool:
        """Whether a live (unexpired) lease exists: the sweeper leaves such threads alone."""
        ...

    def revoke(self, thread_id: str) -> None:
        """Drop the thread's lease whoever holds it, so the holder's next renewal fails
        (``LeaseLost``): closing a thread stops a running slice at its next boundary."""
        ...
