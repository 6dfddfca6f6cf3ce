"""The records the runtime keeps: a thread, its items, calls, inbox, outbox and timer rows,
and what a slice reads (``Snapshot``) and writes (``Commit``).

Enums and frozen dataclasses, the same in every backend; the protocols that keep them are
in ``stores/base.py``, which hands these names on too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum, StrEnum
from typing import Any

from dormant.errors import ConfigurationError
from dormant.messages import Inbound, Item, Usage

__all__ = [
    "RETRIED_MARK",
    "AgentCard",
    "CallRecord",
    "CallState",
    "Commit",
    "InboxRow",
    "InboxState",
    "NewThread",
    "NewTimer",
    "OutboxRow",
    "Priority",
    "PruneCounts",
    "Snapshot",
    "Spend",
    "StoredItem",
    "ThreadInfo",
    "ThreadStatus",
    "TimerRow",
    "VersionChange",
    "VersionSpan",
    "WorkerCard",
    "usage_key",
    "version_spans",
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
    """The highest inbox id a slice has looked at, committed or deferred for model
    capacity: the sweeper wakes a deferred thread before its ``retry_at`` only for user
    text above it (sent after the deferral, not the user text the deferral was told a
    turn for)."""
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
    code_version: str = ""
    """The version of the agent that ran the thread's last committed slice
    (``Agent.fingerprint``); empty before its first. ``dormant versions`` counts open
    threads by it: a deploy's old version is drained when none is left on it."""
    message_completions: int = 0
    """The thread's own completions since the last user text it applied (``retry``
    resets it): what ``Budget.max_completions_per_message`` bounds."""
    source_id: str | None = None
    """On a fork (``runtime/forks.py``): the thread whose history it inherits up to
    ``fork_seq``, by reference. A fork is a root of its own: closing, pruning or
    budgeting its source never reaches it (``parent_id`` is for children only)."""
    tag: str | None = None
    """A replay's tag (``"replay:<tag>"``): its usage is counted apart, under
    ``usage_key`` (``dormant usage``), never mixed with production's."""


def usage_key(agent: str, tag: str | None) -> str:
    """The name a thread's usage is summed under: its agent, and a replay's tag apart."""
    return agent if not tag else f"{agent} [{tag}]"


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
    trace: str = ""
    """While the row waits, the trace context of whoever sent the message
    (``dormant.tracing.carrier``; empty when nothing was traced): the slice that applies
    it continues or links that trace. Once done, the context of that slice (a traced
    commit replaces it), which the dashboard's and ``dormant show``'s trace links use."""


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
    trace: str = ""
    """The trace context of the slice that wrote the row: the tool's span is its child."""


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
    """Inbox rows: those of the threads deleted, and finished (done, rejected) ones of
    live threads."""
    outbox: int = 0
    """Outbox rows: those of the threads deleted, and ones a worker ran."""
    timers: int = 0
    """Timers: those of the threads deleted, and fired ones."""

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
    source_id: str | None = None
    """A fork's source (``ThreadInfo.source_id``)."""
    status: ThreadStatus = ThreadStatus.IDLE
    """Waiting for a fork that keeps calls open at its fork point; idle otherwise."""
    tag: str | None = None
    """``ThreadInfo.tag``."""
    trace: str = ""
    """The trace context stored with ``messages`` (``InboxRow.trace``)."""
    retry_at: datetime | None = None
    """Not before (``ThreadInfo.retry_at``): a background launch parked in its queue for
    model capacity (``admission.park``), which the sweeper leaves alone until then."""


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
    the same transaction (a child's seed, a report to a parent; for the thread itself, the
    results a budget stop held back); duplicates are ignored."""
    usage: Usage | None = None
    closed_reason: str = ""
    """With status closed: why (kept on the thread's record, shown by ``dormant show``)."""
    spend: Spend | None = None
    """What the slice's model calls used: a ledger row, added to the root's tree totals."""
    message_completions: int | None = None
    """The thread's new count of completions since its last user text (with ``spend``)."""
    code_version: str = ""
    """The version of the agent the slice ran (``ThreadInfo.code_version``); empty keeps
    the thread's (a close, a compaction summary kept alone)."""
    version_change: VersionChange | None = None
    """Set when the slice ran another version than the thread's last (a deploy came
    between): the store keeps it, so a thread's record says which code ran each slice."""
    trace: str = ""
    """The slice's trace context, stored with its outbox rows, its messages for other
    threads and the inbox rows it applied (``OutboxRow.trace``, ``InboxRow.trace``)."""


@dataclass(frozen=True)
class VersionChange:
    """A thread's items from ``from_seq`` on were made by ``Commit.code_version``; those
    before, back to the previous change, by ``previous``."""

    from_seq: int
    previous: str


@dataclass(frozen=True)
class VersionSpan:
    """The agent version that ran a thread's slices from ``from_seq`` on, until the next
    span's: ``QueryStore.version_spans`` lists a thread's spans, oldest first.

    Only changes are stored (nothing for a thread one version ran), so the first span
    starts at the thread's first own item and its ``since`` is the thread's creation."""

    from_seq: int
    code_version: str
    since: datetime


def version_spans(
    info: ThreadInfo, changes: list[tuple[int, str, str, datetime]]
) -> list[VersionSpan]:
    """A thread's spans from its stored changes, oldest first: (from_seq, code_version,
    previous, at) each. The first span is the first change's ``previous`` (or the thread's
    version when none met it), from the thread's first own item."""
    first = VersionSpan(
        (info.fork_seq or 0) + 1, changes[0][2] if changes else info.code_version, info.created_at
    )
    return [first, *(VersionSpan(seq, version, at) for seq, version, _, at in changes)]


@dataclass(frozen=True)
class WorkerCard:
    """What one process that runs agents announced (a Celery worker, a ``LocalSystem``):
    the agents it has, each with its tools and version, renewed every
    ``Settings.announce_interval_s`` (``seen_at``). The roster of cards tells a process
    that lacks a name whether another one has it (``runtime/whereabouts.py``)."""

    worker_id: str
    host: str
    agents: dict[str, AgentCard]
    started_at: datetime
    seen_at: datetime


@dataclass(frozen=True)
class AgentCard:
    """One agent as a worker has it: its version and the names its tools answer to
    (aliases included)."""

    version: str
    tools: frozenset[str]
