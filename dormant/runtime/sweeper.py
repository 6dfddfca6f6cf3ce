"""The sweeper: re-drive from SQL whatever a crash, a lost task or a flushed Redis left behind.

One pass (``sweep_once``) is shared by ``LocalSystem``'s sweeper thread and the
``dormant.sweep`` Celery beat task. Every step is safe to run twice or concurrently: timers
are claimed by a conditional UPDATE, a re-dispatched tool sees its call already answered,
and a redundant wake finds the lease taken or the inbox empty.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from dormant.runtime.slice import Dispatcher
from dormant.stores.base import Lease, SweepStore

__all__ = ["sweep_once"]


def sweep_once(
    store: SweepStore,
    lease: Lease,
    dispatcher: Dispatcher,
    now: datetime,
    grace_s: float,
    lost_after_s: float,
    close_idle: Callable[[datetime], bool] | None = None,
) -> bool:
    """Fire due timers; re-dispatch outbox rows whose run stopped renewing its claim (its
    worker died), rows never dispatched after ``grace_s``, and rows dispatched
    ``lost_after_s`` ago that no worker started (the broker lost the task); re-wake threads
    with unapplied inbox rows, no live lease and no pending backoff; with ``close_idle``
    (``runtime/close.py``), close threads idle past their agent's limit. True if anything
    was done."""
    woke = False
    for row in store.fire_due_timers(now):
        dispatcher.wake(row.thread_id, row.priority)
        woke = True
    for lapsed in store.expired_claims(now):
        if store.reclaim_outbox(lapsed.id, now):  # one sweeper wins each row
            dispatcher.dispatch(lapsed)
            woke = True
    lost_before = now - timedelta(seconds=lost_after_s)
    for outbox in store.undispatched(now - timedelta(seconds=grace_s), lost_before=lost_before):
        dispatcher.dispatch(outbox)
        store.mark_dispatched([outbox.id])
        woke = True
    for thread_id, priority in store.wakes_due(now=now):
        if not lease.held(thread_id):
            dispatcher.wake(thread_id, priority)
            woke = True
    if close_idle is not None and close_idle(now):
        woke = True
    return woke
