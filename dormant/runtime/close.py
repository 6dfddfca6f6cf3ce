"""Closing a thread from outside its slices: ``close_thread`` for callers (``Client``,
``LocalSystem``, ``dormant close``) and ``close_idle_threads`` for the sweeper.

A close is one version-guarded ``Commit`` built from the thread's snapshot, with no model:
the same commit a slice writes when the agent calls ``close_thread`` (``stores/closing.py``
answers the pending calls and names the streams to stop, the store closes the descendants
in the same transaction), plus the thread's open inbox rows rejected with the reason and
its timers cancelled. A slice that commits meanwhile moves the version: the close reloads
and tries again. A slice still running when the close commits fails its own version guard,
so nothing of it is written; the close also revokes the thread's lease, so that slice's
next renewal (while it streams) raises ``LeaseLost`` and it abandons the model call there
rather than at its commit.

Once the commit is made the close is done: what follows (the lease revoked, the "cancel"
rows sent, the parent woken, the events published: Redis and the broker) is best effort.
A part that fails is told to ``Closing.incomplete`` (by default: logged as a warning),
never raised: the caller would report a close that happened as failed. What each part would
have done happens anyway, later: a running slice stops at its commit (its version
guard) and its lease expires after ``lease_ttl_s``; the sweeper sends the unsent "cancel"
rows and wakes the parent for its queued report; only the live events are lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from dormant.agents import AgentRegistry
from dormant.errors import ControlSignal, DormantError
from dormant.messages import ChildReport, Event, Inbound, ItemAdded, Rejected, StatusChanged
from dormant.runtime.deps import Dispatcher, EventSink
from dormant.stores.base import (
    Commit,
    Lease,
    OutboxRow,
    Priority,
    SliceStore,
    Snapshot,
    SweepStore,
    ThreadInfo,
    ThreadStatus,
)
from dormant.stores.closing import close_calls, streams_to_stop

__all__ = [
    "CLOSE_ATTEMPTS",
    "IDLE_BATCH",
    "CloseStore",
    "Closing",
    "close_idle_threads",
    "close_thread",
    "log_incomplete",
]

log = logging.getLogger("dormant.close")

CLOSE_ATTEMPTS = 50
"""Commits tried before giving up: each stale one means a slice committed meanwhile, and
a thread commits at most once per slice, so a few tries always suffice in practice."""

IDLE_BATCH = 100
"""Threads of one agent closed per sweep for being idle too long; the next sweep goes on."""


class CloseStore(SliceStore, SweepStore, Protocol):
    """What closing reads and writes."""


def log_incomplete(thread_id: str, missed: str, error: Exception) -> None:
    """The default report of a part of a stored close that failed: a warning."""
    log.warning(
        "thread %s is closed, but %s: %s: %s", thread_id, missed, type(error).__name__, error
    )


@dataclass(frozen=True)
class Closing:
    """What a close talks to. Without a ``dispatcher`` the sweeper sends the "cancel"
    rows and wakes the parent; without ``lease`` a running slice stops only at its commit;
    without ``events`` nothing is published."""

    store: CloseStore
    dispatcher: Dispatcher | None = None
    lease: Lease | None = None
    events: EventSink | None = None
    incomplete: Callable[[str, str, Exception], None] = log_incomplete
    """Told (thread id, what was not done, the error) when a part after the commit fails;
    by default a warning is logged."""


def close_thread(thread_id: str, reason: str, deps: Closing) -> ThreadInfo:
    """Close ``thread_id`` (root or child) and its descendants; its record after.
    Idempotent: a closed thread is returned as it is. Raises ``UnknownThread``."""
    closed = _close(thread_id, reason, deps, idle_before=None)
    assert closed is not None  # only an idle-limit close can decline
    return closed


def _close(
    thread_id: str, reason: str, deps: Closing, *, idle_before: datetime | None
) -> ThreadInfo | None:
    """``close_thread``; with ``idle_before``, only a thread still idle since before then
    with nothing queued (else None: it woke up meanwhile)."""
    for _ in range(CLOSE_ATTEMPTS):
        snap = deps.store.load(thread_id)
        thread = snap.thread
        if thread.status is ThreadStatus.CLOSED:
            return thread
        if idle_before is not None and not _still_idle(snap, idle_before):
            return None
        commit = _closing_commit(snap, reason)
        rows = deps.store.commit(commit)
        if rows is None:
            continue  # a slice committed meanwhile: close what it left
        _after_close(deps, snap, commit, rows)
        return deps.store.thread(thread_id)
    raise DormantError(
        f"thread {thread_id!r} kept changing: not closed after {CLOSE_ATTEMPTS} attempts"
    )


def _after_close(deps: Closing, snap: Snapshot, commit: Commit, rows: list[OutboxRow]) -> None:
    """The close's best-effort parts, each on its own (see the module docstring)."""
    thread_id = snap.thread.id
    lease, dispatcher, events = deps.lease, deps.dispatcher, deps.events
    if lease is not None:
        unrevoked = "its lease was not revoked (a running slice stops at its commit)"
        with _best_effort(deps, thread_id, unrevoked):
            _revoke_tree(deps.store, lease, thread_id)
    if dispatcher is not None and rows:
        unsent = 'its "cancel" rows were not sent (the sweeper sends them)'
        with _best_effort(deps, thread_id, unsent):
            for row in rows:
                dispatcher.dispatch(row)
            deps.store.mark_dispatched([row.id for row in rows])
    if dispatcher is not None:
        for target in {t for t, *_ in commit.enqueue}:  # the parent, for its report
            unwoken = f"its parent {target} was not woken (the sweeper wakes it)"
            with _best_effort(deps, thread_id, unwoken):
                dispatcher.wake(target, Priority.BACKGROUND)
    if events is not None:
        with _best_effort(deps, thread_id, "its live events were not published"):
            for event in _events(snap, commit):
                events.publish(event)


@contextmanager
def _best_effort(deps: Closing, thread_id: str, missed: str) -> Iterator[None]:
    try:
        yield
    except ControlSignal:
        raise
    except Exception as error:
        deps.incomplete(thread_id, missed, error)


def close_idle_threads(deps: Closing, agents: AgentRegistry, now: datetime) -> int:
    """Close the threads of each agent with ``close_after_idle_s`` idle past it, up to
    ``IDLE_BATCH`` an agent; how many were closed. A failure is logged and skipped: the
    next sweep tries again."""
    closed = 0
    for name in agents:
        limit_s = agents[name].close_after_idle_s
        if limit_s is None:
            continue
        idle_before = now - timedelta(seconds=limit_s)
        reason = f"idle for more than {limit_s:g} s"
        for thread_id in deps.store.idle_threads(name, idle_before, IDLE_BATCH):
            try:
                done = _close(thread_id, reason, deps, idle_before=idle_before)
            except DormantError:
                log.warning("closing idle thread %s failed", thread_id, exc_info=True)
                continue
            closed += done is not None
    return closed


def _revoke_tree(store: SliceStore, lease: Lease, thread_id: str) -> None:
    """Revoke the leases of the thread and of every descendant the commit closed, so
    their running slices stop at their next renewal too."""
    todo = [thread_id]
    while todo:
        current = todo.pop()
        lease.revoke(current)
        todo += [child.id for child in store.children(current)]


def _still_idle(snap: Snapshot, idle_before: datetime) -> bool:
    thread = snap.thread
    return thread.status is ThreadStatus.IDLE and not snap.inbox and thread.updated_at < idle_before


def _closing_commit(snap: Snapshot, reason: str) -> Commit:
    thread = snap.thread
    calls = snap.calls.values()
    stopped = [(c.call_id, "cancel") for c in streams_to_stop(calls, thread)]
    changed, results = close_calls(thread.id, calls, snap.next_seq)
    refusal = f"thread {thread.id!r} was closed: {reason}"
    enqueue: list[tuple[str, str, Inbound, int]] = []
    reports = thread.metadata.get("role") != "event"  # an event thread closes silently
    if thread.parent_id is not None and thread.parent_call_id is not None and reports:
        report = ChildReport(
            call_id=thread.parent_call_id,
            child_thread_id=thread.id,
            content=f"Child thread {thread.id} was closed: {reason}",
            final=True,
        )
        enqueue.append((thread.parent_id, f"closed:{thread.id}", report, Priority.BACKGROUND))
    return Commit(
        thread_id=thread.id,
        version=thread.version,
        status=ThreadStatus.CLOSED,
        inbox_seen=max([thread.inbox_seen, *(row.id for row in snap.inbox)]),
        items=results,
        calls=changed,
        rejected=[(row.id, refusal) for row in snap.inbox],
        outbox=stopped,
        cancel_timers=sorted(snap.calls),
        close_descendants=True,
        enqueue=enqueue,
        closed_reason=reason,
    )


def _events(snap: Snapshot, commit: Commit) -> list[Event]:
    thread_id = snap.thread.id
    rows = {row.id: row for row in snap.inbox}
    events: list[Event] = [
        ItemAdded(thread_id=thread_id, seq=s.seq, item=s.item) for s in commit.items
    ]
    events += [
        Rejected(thread_id=thread_id, message_id=rows[row_id].message_id, reason=why)
        for row_id, why in commit.rejected
    ]
    why = commit.closed_reason
    events.append(StatusChanged(thread_id=thread_id, status=ThreadStatus.CLOSED, detail=why))
    return events
