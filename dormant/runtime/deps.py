"""What a slice talks to: ``SliceDeps`` and the narrow protocols behind it (split from
``slice.py``, which re-exports them)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from dormant.agents import AgentRegistry
from dormant.errors import CrashPoint
from dormant.messages import Event
from dormant.runtime.limiter import Limiter
from dormant.settings import Settings
from dormant.stores.base import DedupSet, Lease, OutboxRow, SliceStore

if TYPE_CHECKING:
    from dormant.runtime.whereabouts import Whereabouts

__all__ = ["Dispatcher", "EventSink", "SeparateEnd", "SliceDeps", "SliceEnd"]


class Dispatcher(Protocol):
    def dispatch(self, row: OutboxRow) -> None:
        """Start the outbox row's work off the slice (a tool run, a cancel hook)."""
        ...

    def wake(self, thread_id: str, priority: int) -> bool:
        """Arrange for a slice of ``thread_id`` to run; False if none was queued because
        one at least as urgent already is (what the sweeper reports)."""
        ...


class EventSink(Protocol):
    def publish(self, event: Event) -> None: ...


class SliceEnd(Protocol):
    def end(self, thread_id: str, token: str, message_ids: list[str], events: list[Event]) -> bool:
        """Add ``message_ids`` to the dedup set, publish ``events``, release the lease held
        with ``token``; whether another slice was refused the lease meanwhile. Redis does
        it in one round trip (``RedisSliceEnd``)."""
        ...


@dataclass(frozen=True)
class SeparateEnd:
    """``SliceEnd`` over a dedup set, an event sink and a lease, one call each."""

    dedup: DedupSet
    events: EventSink
    lease: Lease

    def end(self, thread_id: str, token: str, message_ids: list[str], events: list[Event]) -> bool:
        if message_ids:
            self.dedup.add(thread_id, message_ids)
        for event in events:
            self.events.publish(event)
        return self.lease.release(thread_id, token)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SliceDeps:
    """Everything a slice talks to, each behind a narrow protocol."""

    store: SliceStore
    lease: Lease
    dedup: DedupSet
    dispatcher: Dispatcher
    events: EventSink
    agents: AgentRegistry
    settings: Settings
    clock: Callable[[], datetime] = _utcnow
    sleep: Callable[[float], None] = time.sleep
    ending: SliceEnd | None = None
    """How a slice ends in one go; by default ``SeparateEnd`` over the parts above."""
    limiter: Limiter | None = None
    """Admission for model calls (``runtime/admission.py``); None: no limits, no counters."""
    whereabouts: Whereabouts | None = None
    """The roster of workers, asked when this process lacks a thread's agent
    (``runtime/whereabouts.py``); None: a missing agent stalls the thread at once."""
    wakes_at_place_s: float = 0.0
    """A thread deferred for model capacity whose place comes within this long is woken at
    it by whoever runs the slices (a Celery worker retries the slice with that countdown),
    so the sweeper is only its backstop (``runtime/admission.py``, ``PLACE_BACKSTOP_S``);
    0: the sweeper wakes every deferred thread."""
    wake_in: Callable[[str, float], object] | None = None
    """Wake a thread (background) after the seconds given: how an admitted slice wakes the
    threads parked behind it at their turns (``Limiter.next_due``; a Celery countdown);
    None: nothing is parked, the sweeper wakes every deferred thread."""

    def end(self, thread_id: str, token: str, message_ids: list[str], events: list[Event]) -> bool:
        ending = self.ending or SeparateEnd(self.dedup, self.events, self.lease)
        return ending.end(thread_id, token, message_ids, events)

    def crash(self, point: str) -> None:
        """Die here if the test-only setting arms ``point``."""
        if point in self.settings.crash_points:
            raise CrashPoint(point)
