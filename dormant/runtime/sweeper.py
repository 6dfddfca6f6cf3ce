"""The sweeper: re-drive from SQL whatever a crash, a lost task or a flushed Redis left behind.

One pass (``sweep_once``) is shared by ``LocalSystem``'s sweeper thread and, in Celery mode,
the beat process (``celery/beat_sweep.py``). Every step is safe to run twice or
concurrently: timers are claimed by a conditional UPDATE, a re-dispatched tool sees its call
already answered, and a redundant wake finds the lease taken or the inbox empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from dormant.runtime.slice import Dispatcher
from dormant.stores.base import Lease, SweepStore

__all__ = ["Swept", "sweep_once"]


@dataclass(frozen=True)
class Swept:
    """What one pass did. True (``bool``) if it changed or sent anything; a thread whose
    wake the dispatcher suppressed (a wake at least as urgent is already queued) counts in
    ``already_queued``, not in ``woken``: nothing was sent for it."""

    timers: int = 0
    """Due timers fired: their messages are now inbox rows."""
    redispatched: int = 0
    """Outbox rows sent again (never dispatched, lost by the broker, or their run died)."""
    woken: int = 0
    """Slices queued for threads with unapplied rows and no live lease (timers' included)."""
    already_queued: int = 0
    """Wakes not sent: the dispatcher already had one at least as urgent queued."""
    idle_closed: int = 0
    """Threads closed for being idle past their agent's ``close_after_idle_s``."""

    def __bool__(self) -> bool:
        return bool(self.timers or self.redispatched or self.woken or self.idle_closed)

    def summary(self) -> str:
        """``fired 2 timers, re-dispatched 1 outbox row, woke 3 threads, 1 wake already
        queued``; ``nothing to do`` for a quiet pass."""
        parts = [
            _count("fired", self.timers, "timer"),
            _count("re-dispatched", self.redispatched, "outbox row"),
            _count("woke", self.woken, "thread"),
            f"{_plural(self.already_queued, 'wake')} already queued" if self.already_queued else "",
            _count("closed", self.idle_closed, "idle thread"),
        ]
        return ", ".join(part for part in parts if part) or "nothing to do"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _count(verb: str, count: int, noun: str) -> str:
    return f"{verb} {_plural(count, noun)}" if count else ""


def sweep_once(
    store: SweepStore,
    lease: Lease,
    dispatcher: Dispatcher,
    now: datetime,
    grace_s: float,
    lost_after_s: float,
    close_idle: Callable[[datetime], int] | None = None,
) -> Swept:
    """Fire due timers; re-dispatch outbox rows whose run stopped renewing its claim (its
    worker died), rows never dispatched after ``grace_s``, and rows dispatched
    ``lost_after_s`` ago that no worker started (the broker lost the task); re-wake threads
    with unapplied inbox rows, no live lease and no pending backoff; with ``close_idle``
    (``runtime/close.py``, where the agents are known), close threads idle past their
    agent's limit."""
    wakes: dict[str, int] = {}
    """The threads this pass has asked to wake, at the highest priority asked."""
    woken = already_queued = 0

    def wake(thread_id: str, priority: int) -> None:
        nonlocal woken, already_queued
        if wakes.get(thread_id, -1) >= priority:
            return  # a timer's wake just now: its row is one of the unapplied ones
        wakes[thread_id] = priority
        if dispatcher.wake(thread_id, priority):
            woken += 1
        else:
            already_queued += 1

    timers = store.fire_due_timers(now)
    for row in timers:
        wake(row.thread_id, row.priority)
    redispatched = 0
    for lapsed in store.expired_claims(now):
        if store.reclaim_outbox(lapsed.id, now):  # one sweeper wins each row
            dispatcher.dispatch(lapsed)
            redispatched += 1
    lost_before = now - timedelta(seconds=lost_after_s)
    for outbox in store.undispatched(now - timedelta(seconds=grace_s), lost_before=lost_before):
        dispatcher.dispatch(outbox)
        store.mark_dispatched([outbox.id])
        redispatched += 1
    for thread_id, priority in store.wakes_due(now=now):
        if not lease.held(thread_id):
            wake(thread_id, priority)
    idle_closed = close_idle(now) if close_idle is not None else 0
    return Swept(len(timers), redispatched, woken, already_queued, idle_closed)
