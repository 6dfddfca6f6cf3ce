"""What a slice keeps watch on while its model completes (steps 5-6 of ``runtime/slice.py``).

Streamed text is buffered and published as a chunk now and then (a live view of a long
completion); at the same moments the lease's hold is looked at (``runtime/lease_keeper.py``
renews it), the deadline checked and, for an agent with ``steering="interrupt"``, the inbox
looked at for newer user text (``SteeredAway``). Between those moments a chunk costs one
look at the monotonic clock.

``SliceWatch`` is mixed into the slice (``_Slice``), which sets its attributes in its
``__init__``: a mixin, not an object the slice calls through, since ``_on_chunk`` runs for
every chunk of every completion.
"""

from __future__ import annotations

import time
from datetime import datetime

from dormant.errors import LeaseLost, SteeredAway
from dormant.messages import Chunk, Event
from dormant.models.base import Completion, Model, ModelRequest
from dormant.runtime.admission import Caller, complete_admitted
from dormant.runtime.deps import SliceDeps
from dormant.runtime.failures import check_deadline
from dormant.runtime.lease_keeper import Hold
from dormant.stores.base import ThreadStatus
from dormant.tracing import SliceTrace

__all__ = ["SliceWatch"]


class SliceWatch:
    thread_id: str
    token: str
    deps: SliceDeps
    seen: int
    started_at: datetime
    events: list[Event]
    caller: Caller
    trace: SliceTrace
    steering: bool
    """Whether the agent is steered (``steering="interrupt"``): newer user text ends the
    completion."""
    streamed: str
    """Text streamed since the last flush."""
    attempts: int
    """Completion attempts begun: with the lease token, names the chunks' attempt."""
    boundary: int
    """The seq the turn's first item gets: where its streamed text belongs."""
    hold: Hold
    """The lease as ``runtime/lease_keeper.py`` renews it (``lost`` once refused)."""
    steer_checked_at: float
    flushed_at: float
    next_check_at: float
    """When ``_on_chunk`` next flushes and checks (monotonic seconds): the first
    chunk of a slice always does."""

    def _check_deadline(self) -> None:
        check_deadline(self.deps, self.thread_id, self.started_at)

    def _complete(self, model: Model, request: ModelRequest) -> Completion:
        self._check_lease()
        try:
            return complete_admitted(
                self.deps,
                self.caller,
                self.trace.chat_model(model),
                request,
                self._on_chunk,
                self._between_attempts,
            )
        finally:  # the rest of the text goes out with the slice's other events
            if self.streamed:
                self.events.append(self._chunk())
                self.streamed = ""
            self.flushed_at = time.monotonic()

    def _flush_chunks(self, now: float) -> None:
        """Publish the text streamed since the last flush as one chunk, now (a live view of
        a long completion)."""
        if self.streamed:
            self.deps.events.publish(self._chunk())
            self.streamed = ""
        self.flushed_at = now

    def _chunk(self) -> Chunk:
        # "<boundary>:<slice start, ms>:<lease token>:<model attempt>". A log that moved
        # past the boundary (the commit's items are in) drops the chunk, which the item
        # holds; of two attempts, the one begun later wins (a slice whose lease was lost
        # may stream on a moment beside its successor).
        started_ms = int(self.started_at.timestamp() * 1000)
        attempt = f"{self.boundary}:{started_ms}:{self.token[:8]}:{self.attempts}"
        return Chunk(thread_id=self.thread_id, text=self.streamed, attempt=attempt)

    def _between_attempts(self, wait_s: float) -> None:
        """A model attempt failed: its text goes out as its own, the next is another."""
        self._flush_chunks(time.monotonic())
        self.attempts += 1
        self.deps.sleep(wait_s)

    def _check_lease(self) -> None:
        """Stop if the keeper's renewal was refused: another slice may hold the thread."""
        if self.hold.lost:
            thread = self.deps.store.thread(self.thread_id)  # say why: a close revokes
            closed = thread.status is ThreadStatus.CLOSED
            raise LeaseLost(self.thread_id, thread.closed_reason if closed else None)

    def _on_chunk(self, text: str) -> None:
        """Buffer streamed text; now and then (``_tick_s``) flush it, look at the lease,
        check the deadline and look for steering. Between those, a chunk costs one look
        at the monotonic clock: 25 chunks a completion made the checks a cost of their own.
        """
        self.streamed += text
        now = time.monotonic()
        if now >= self.next_check_at:
            self._check_stream(now)

    def _check_stream(self, now: float) -> None:
        deps = self.deps
        settings = deps.settings
        if now - self.flushed_at >= settings.chunk_flush_s:
            self._flush_chunks(now)
        self._check_lease()
        self._check_deadline()
        if self.steering and now - self.steer_checked_at >= settings.steer_check_s:
            self.steer_checked_at = now
            if deps.store.has_pending_after(self.thread_id, self.seen, user_text_only=True):
                raise SteeredAway(self.thread_id)
        self.next_check_at = now + self._tick_s()

    def _tick_s(self) -> float:
        """How long streaming goes unchecked: the shortest of the flush interval, a third
        of the lease's time-to-live and (when steering) the steering interval."""
        settings = self.deps.settings
        tick_s = min(settings.chunk_flush_s, settings.lease_ttl_s / 3)
        return min(tick_s, settings.steer_check_s) if self.steering else tick_s
