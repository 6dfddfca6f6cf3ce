"""Re-driving a thread (``retry``): un-stall it and requeue its quarantined messages.

One place for ``BaseClient.retry`` (which then wakes the thread) and ``dormant retry``
(which leaves the wake to the sweeper: the command has no broker).
"""

from __future__ import annotations

from dataclasses import dataclass

from dormant.errors import UnknownMessage
from dormant.runtime.history import pending
from dormant.stores.base import InboxRow, Store, ThreadInfo, ThreadStatus

__all__ = ["Redriven", "redrive"]


@dataclass(frozen=True)
class Redriven:
    thread: ThreadInfo
    """The thread's record after (idle or waiting if it was stalled)."""
    released: list[InboxRow]
    """The quarantined messages put back in its inbox."""
    unstalled: bool


def redrive(store: Store, thread_id: str, message_id: str | None = None) -> Redriven:
    """Put the thread's quarantined messages (or only ``message_id``) back in its inbox and
    un-stall it; ``UnknownMessage`` if ``message_id`` is not quarantined there."""
    released = store.release_quarantined(thread_id, message_id)
    if message_id is not None and not released:
        raise UnknownMessage(thread_id, message_id)
    snap = store.load(thread_id)
    thread = snap.thread
    stalled = thread.status is ThreadStatus.STALLED
    if stalled:
        status = ThreadStatus.WAITING if pending(snap.calls) else ThreadStatus.IDLE
        thread = store.set_status(thread_id, status)
    return Redriven(thread, released, stalled)
