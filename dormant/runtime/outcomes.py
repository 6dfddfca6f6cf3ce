"""What a slice ends in: a small closed set of outcomes the caller ``match``es on."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dormant.runtime.history import Applied, has_pending, pending
from dormant.runtime.turn import Turn
from dormant.stores.base import (
    CallRecord,
    CallState,
    Priority,
    SliceStore,
    ThreadInfo,
    ThreadStatus,
)

__all__ = [
    "Busy",
    "Closed",
    "Deferred",
    "Failed",
    "Idle",
    "Left",
    "Missing",
    "SliceOutcome",
    "Stale",
    "Stalled",
    "Steered",
    "Waiting",
    "rewake_priority",
    "settled",
    "status_after",
    "waiting_on",
]


@dataclass(frozen=True)
class Busy:
    """Another slice holds the lease; it drains the inbox."""

    thread_id: str


@dataclass(frozen=True)
class Missing:
    thread_id: str


@dataclass(frozen=True)
class Idle:
    thread_id: str


@dataclass(frozen=True)
class Waiting:
    thread_id: str
    call_ids: tuple[str, ...]
    tools: tuple[str, ...] = ()
    """The tool name of each pending call, in ``call_ids`` order."""


@dataclass(frozen=True)
class Closed:
    thread_id: str


@dataclass(frozen=True)
class Stale:
    """The version moved under us: another holder owns the thread; nothing was written."""

    thread_id: str


@dataclass(frozen=True)
class Failed:
    """The slice raised (the model, the agent's code, a bug); nothing was committed and the
    messages stay queued until ``retry_at`` (the sweeper will not wake the thread before).
    ``error`` is the last line of the traceback, as stored in the thread's ``last_error``."""

    thread_id: str
    error: str
    stalled: bool
    retry_at: datetime | None = None
    quarantined: str | None = None
    """The id of the message set aside (poison): the thread goes on with its other input."""


@dataclass(frozen=True)
class Steered:
    """New user text cancelled the completion (``interrupt`` steering); nothing was
    committed and a new slice applies everything, the new text included."""

    thread_id: str


@dataclass(frozen=True)
class Deferred:
    """No model capacity (admission refused, or the provider answered 429): nothing was
    consumed or counted as a failure; the thread asks again at ``not_before`` (a Celery
    worker retries the slice then when that is soon; the sweeper wakes it otherwise)."""

    thread_id: str
    not_before: datetime
    wait_s: float


@dataclass(frozen=True)
class Left:
    """This process lacks the thread's agent and another worker has it, or may soon (a
    rolling deploy): nothing was written, and the thread is left for a worker that has it
    (a Celery worker sends the slice back to the queue; the sweeper wakes it otherwise)."""

    thread_id: str
    why: str
    not_before: datetime


@dataclass(frozen=True)
class Stalled:
    """The thread is stalled and was not run; ``retry`` re-drives it."""

    thread_id: str
    error: str


SliceOutcome = (
    Busy | Missing | Idle | Waiting | Closed | Stale | Failed | Stalled | Steered | Deferred | Left
)


def settled(thread_id: str, status: ThreadStatus, calls: dict[str, CallRecord]) -> SliceOutcome:
    if status is ThreadStatus.CLOSED:
        return Closed(thread_id)
    waiting = pending(calls)
    if not waiting:
        return Idle(thread_id)
    return Waiting(thread_id, tuple(c.call_id for c in waiting), tuple(c.name for c in waiting))


def rewake_priority(store: SliceStore, thread_id: str, seen: int) -> Priority:
    """The priority of a re-wake for rows that arrived during the slice: interactive only
    if user text is among them, so tool results never jump the user-text queue."""
    if store.has_pending_after(thread_id, seen, user_text_only=True):
        return Priority.INTERACTIVE
    return Priority.BACKGROUND


def waiting_on(applied: Applied) -> str:
    """What a waiting thread waits for, for its status event: ``"on run_build (call_1)"``,
    ``"awaiting approval of refund (call_2)"``."""
    calls = [c for c in applied.calls.values() if c.state is CallState.PENDING]
    held = [f"{c.name} ({c.call_id})" for c in calls if c.call_id in applied.awaiting]
    running = [f"{c.name} ({c.call_id})" for c in calls if c.call_id not in applied.awaiting]
    parts = ["awaiting approval of " + ", ".join(held)] if held else []
    parts += ["on " + ", ".join(running)] if running else []
    return "; ".join(parts)


def status_after(thread: ThreadInfo, applied: Applied, turn: Turn) -> ThreadStatus:
    """The status a slice commits: closed, waiting on a pending call, or idle."""
    if thread.status is ThreadStatus.CLOSED or turn.closing:
        return ThreadStatus.CLOSED
    if has_pending(applied.calls):
        return ThreadStatus.WAITING
    if thread.metadata.get("role") == "event" and applied.woke:
        return ThreadStatus.CLOSED  # a temporary thread that went idle has nothing left to do
    return ThreadStatus.IDLE
