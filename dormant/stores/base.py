"""The records the runtime keeps and the narrow protocols that keep them.

The slice needs only ``SliceStore``; clients need ``InboxStore`` and ``QueryStore``; the
sweeper needs ``SweepStore``. ``Store`` is all four, which every backend implements (memory,
SQLite, PostgreSQL) against one contract test suite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum, StrEnum
from typing import Any, Protocol

from dormant.errors import ConfigurationError
from dormant.messages import Inbound, Item, Usage

__all__ = [
    "RETRIED_MARK",
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
]


class Priority(IntEnum):
    """Broker priority of a send: user-facing wake-ups first."""

    INTERACTIVE = 8
    BACKGROUND = 4

    @classmethod
    def of(cls, value: Priority | str) -> Priority:
        """A launch's ``priority=``: a member, or its name in lower case ("interactive",
        "background"). Anything else is refused, so a typo never launches at a wrong queue."""
        if isinstance(value, Priority):
            return value
        if isinstance(value, str) and value in ("interactive", "background"):
            return cls[value.upper()]
        raise ConfigurationError(
            f"priority {value!r} is not one of 'interactive', 'background' "
            "(or Priority.INTERACTIVE, Priority.BACKGROUND)"
        )


class ThreadStatus(StrEnum):
    IDLE = "idle"
    """No call is pending: the thread waits for user text or an event."""
    WAITING = "waiting"
    """At least one call is pending."""
    CLOSED = "closed"
    STALLED = "stalled"
    """The model failed too often; ``retry`` re-drives it."""


class CallState(StrEnum):
    PENDING = "pending"
    ANSWERED = "answered"
    INTERRUPTED = "interrupted"
    SUBSCRIBED = "subscribed"
    CANCELLED = "cancelled"


class InboxState(StrEnum):
    PENDING = "pending"
    """Not yet looked at by a slice: the sweeper wakes threads that have such rows."""
    DEFERRED = "deferred"
    """Looked at and held back (an event while a call is pending); the next slice the
    thread runs for another reason applies it. Recorded explicitly rather than inferred
    from an id watermark, because rows may become visible out of id order."""
    DONE = "done"
    REJECTED = "rejected"
    QUARANTINED = "quarantined"
    """Set aside after its slice failed ``quarantine_after_failures`` times with this row
    alone as input; ``reason`` holds the error. ``retry`` makes it pending again."""


RETRIED_MARK = "retried after quarantine: "
"""The start of the ``reason`` of a row ``retry`` released from quarantine: it was applied
when the operator retried it, after input that arrived later (``dormant check`` knows)."""


@dataclass(frozen=True, slots=True)
class Spend:
    """What model calls used: a slice's (one ledger row), or a sum of them."""

    completions: int = 0
    input_tokens: int = 0
    """Prompt tokens, the cached ones included."""
    output_tokens: int = 0
    cached_tokens: int = 0
    cost: float = 0.0
    """In the price table's currency (``dormant.models.prices``); 0 for unpriced models."""

    @property
    def tokens(self) -> int:
        """What ``Budget.max_tokens`` counts: input + output."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            self.completions + other.completions,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_tokens + other.cached_tokens,
            self.cost + other.cost,
        )


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    id: str
    agent: str
    status: ThreadStatus
    version: int
    created_at: datetime
    updated_at: datetime
    parent_id: str | None = None
    parent_call_id: str | None = None
    fork_seq: int | None = None
    root_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    """Usage of the last completion (drives compaction)."""
    failures: int = 0
    """Consecutive slices that ended in a model failure."""
    last_error: str = ""
    inbox_seen: int = 0
    """The highest inbox id a committed slice has looked at (informational)."""
    retry_at: datetime | None = None
    """After a failed slice: the sweeper leaves the thread alone until then (backoff)."""
    closed_reason: str = ""
    """Why the thread was closed (``close_thread(reason=...)``, an idle limit, an
    ancestor's close); empty while it is open, or when it closed itself."""
    tree_tokens: int = 0
    """On a root: input + output tokens its whole tree spent (children and event threads
    add theirs here); 0 on other threads."""
    tree_cost: float = 0.0
    """On a root: what its whole tree's completions cost."""
    message_completions: int = 0
    """The thread's own completions since the last user text it applied (``retry``
    resets it): what ``Budget.max_completions_per_message`` bounds."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    call_id: str
    name: str
    args: dict[str, Any]
    seq: int
    state: CallState
    subscription: bool = False
    passive: bool = False


@dataclass(frozen=True, slots=True)
class StoredItem:
    seq: int
    message_id: str
    item: Item


@dataclass(frozen=True, slots=True)
class InboxRow:
    id: int
    thread_id: str
    message_id: str
    message: Inbound
    priority: int
    state: InboxState
    created_at: datetime
    reason: str = ""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    thread_id: str
    call_id: str
    action: str
    created_at: datetime
    dispatched_at: datetime | None = None
    ran_at: datetime | None = None
    """When a worker ran it; a row dispatched long ago that never ran was lost by the broker."""
    claimed_until: datetime | None = None
    """The running task's heartbeat: while it is in the future a live run holds the row."""
    runs: int = 0
    """Runs started (claims taken); all but a live last one died."""


@dataclass(frozen=True, slots=True)
class TimerRow:
    id: int
    thread_id: str
    call_id: str
    due_at: datetime
    message_id: str
    message: Inbound
    fired_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class PruneCounts:
    """What one retention batch deleted (``Store.prune_batch``)."""

    threads: int = 0
    """Closed threads deleted, each with every row it owns."""
    inbox: int = 0
    """Finished (done, rejected) inbox rows of live threads."""
    outbox: int = 0
    """Outbox rows a worker ran."""
    timers: int = 0
    """Fired timers."""

    @property
    def total(self) -> int:
        return self.threads + self.inbox + self.outbox + self.timers

    def __add__(self, other: PruneCounts) -> PruneCounts:
        return PruneCounts(
            self.threads + other.threads,
            self.inbox + other.inbox,
            self.outbox + other.outbox,
            self.timers + other.timers,
        )


@dataclass(frozen=True, slots=True)
class NewTimer:
    call_id: str
    due_at: datetime
    message_id: str
    message: Inbound


@dataclass(frozen=True, slots=True)
class NewThread:
    """A thread to create in a commit (a child spawned by the turn)."""

    id: str
    agent: str
    parent_id: str | None = None
    parent_call_id: str | None = None
    fork_seq: int | None = None
    root_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    items: list[StoredItem] = field(default_factory=list)
    """The child's first own items (results it owes for calls of the inherited fork turn)."""
    calls: list[CallRecord] = field(default_factory=list)
    """Calls the child knows from its parent (the spawn or subscription call it reports on)."""
    messages: list[tuple[str, Inbound, int]] = field(default_factory=list)
    """(message_id, message, priority) inbox rows queued with the thread, in the same
    transaction (a launch's first message): a thread never exists without them."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a slice reads: the thread, its model-visible history, calls and pending inbox."""

    thread: ThreadInfo
    items: list[StoredItem]
    """The model-visible history: inherited prefix, latest summary, own items."""
    calls: dict[str, CallRecord]
    inbox: list[InboxRow]
    """Pending and deferred rows, in inbox order."""
    next_seq: int
    """The seq the next own item gets (seqs continue the inherited prefix in a child)."""


@dataclass(frozen=True, slots=True)
class Commit:
    """Everything one slice writes, in one transaction guarded by ``version``."""

    thread_id: str
    version: int
    status: ThreadStatus
    inbox_seen: int
    items: list[StoredItem] = field(default_factory=list)
    """New items, with seqs from ``Snapshot.next_seq`` on (the version guard makes them safe)."""
    calls: list[CallRecord] = field(default_factory=list)
    """Inserted or updated call records (upsert by (thread_id, call_id))."""
    done: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)
    outbox: list[tuple[str, str]] = field(default_factory=list)
    """(call_id, action) rows to dispatch after the commit."""
    timers: list[NewTimer] = field(default_factory=list)
    cancel_timers: list[str] = field(default_factory=list)
    """Call ids whose unfired timers are deleted (a sleep that was interrupted or woken)."""
    threads: list[NewThread] = field(default_factory=list)
    """Threads created by this commit (children spawned by the turn)."""
    close_descendants: bool = False
    """Close every open descendant and cancel their live subscriptions (a "cancel" outbox
    row each, returned with this commit's rows so the hooks run)."""
    enqueue: list[tuple[str, str, Inbound, int]] = field(default_factory=list)
    """Messages for other threads, (thread_id, message_id, message, priority), written in
    the same transaction (a child's seed, a report to a parent); duplicates are ignored."""
    usage: Usage | None = None
    closed_reason: str = ""
    """With status closed: why (kept on the thread's record, shown by ``dormant show``)."""
    spend: Spend | None = None
    """What the slice's model calls used: a ledger row, added to the root's tree totals."""
    message_completions: int | None = None
    """The thread's new count of completions since its last user text (with ``spend``)."""


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

    def defer(self, thread_id: str, not_before: datetime) -> None:
        """Leave the thread to the sweeper until ``not_before`` (its ``retry_at``) without
        counting a failure: admission found no model capacity (``runtime/admission.py``)."""
        ...

    def quarantine(self, thread_id: str, inbox_id: int, reason: str) -> ThreadInfo:
        """Set an open inbox row aside (``QUARANTINED`` with ``reason``) and clear the
        thread's failures, so its other input goes on at once."""
        ...

    def children(self, thread_id: str) -> list[ThreadInfo]:
        """Direct children, oldest first."""
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
    ) -> InboxRow:
        """Queue a message; raises ``UnknownThread``, ``ThreadClosed``, ``UnknownCall``,
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


class QueryStore(Protocol):
    def thread(self, thread_id: str) -> ThreadInfo: ...

    def threads(
        self,
        status: ThreadStatus | None = None,
        limit: int = 100,
        *,
        agent: str | None = None,
        before: tuple[datetime, str] | None = None,
    ) -> list[ThreadInfo]:
        """Threads newest first (by ``created_at``, then ``id``), of ``agent`` if given.

        ``before`` is the ``(created_at, id)`` of the last thread of a previous page: the
        page after it (keyset paging, as fast on the thousandth page as on the first)."""
        ...

    def history(self, thread_id: str) -> list[StoredItem]:
        """The model-visible history (inherited prefix, summaries, own items)."""
        ...

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
        """The thread's own stored items (no inheritance), up to ``upto_seq`` inclusive."""
        ...

    def call(self, thread_id: str, call_id: str) -> CallRecord: ...

    def inbox(self, thread_id: str, state: InboxState | None = None) -> list[InboxRow]: ...

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
        pending, longest-waiting first."""
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
        its digest set). ``dry_run`` deletes nothing and counts every candidate (not one
        batch's worth; its row counts include the rows of the trees it counts)."""
        ...


class Store(SliceStore, InboxStore, QueryStore, SweepStore, Protocol):
    """Everything a backend provides."""

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
