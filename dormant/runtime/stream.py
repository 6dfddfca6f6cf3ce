"""Reading a thread's stream: committed items from the store, live events from the live log,
merged by id (``dormant.streams`` says what the ids are).

The reader keeps its place as the last id it delivered, ``(c, n)``, and the next item seq it
owes, ``expected``. Each round it reads the live log after its place, then, only when the
log shows a commit it has not delivered (or every ``refresh_s``, or at the start), the
store's items from ``expected`` on. The log is read before the store, and every commit is
in the store before its events reach the log, so an item the log announces is always in
the store read that follows: nothing is skipped. Items from the store and from the log
share their ids, and anything at or before the place is dropped: nothing is seen twice.
A close is the one event the store can show before the log does: the reader waits for its
live status (``LOST_CLOSE_AFTER_S``) and says the close itself only when none came.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from dormant.errors import ConfigurationError, InvalidStreamId
from dormant.messages import AssistantTurn, ItemAdapter
from dormant.stores.base import Store, StoredItem, ThreadInfo, ThreadStatus
from dormant.stores.lineage import next_seq
from dormant.streams import (
    CLOSED_N,
    LiveEntry,
    LiveLog,
    StreamChunk,
    StreamDispatched,
    StreamEvent,
    StreamItem,
    StreamRetry,
    StreamStatus,
    format_id,
    parse_id,
)

__all__ = ["MIN_LIVE_N", "REFRESH_S", "StreamMethods", "StreamReader", "astream", "stream"]

REFRESH_S = 10.0
"""How often an idle reader re-marks its thread watched and re-reads the store (what it
missed while the live log was lost is in the store)."""
LOST_CLOSE_AFTER_S = 2.0
"""How long a close the store shows may go without its live status before the reader says
it itself. The live status follows the commit by milliseconds; a reader that read the
store in between must wait for it (its id is the one every other reader gets), and only
a close whose status never came (a Redis flush, a crash between the two) is said here."""
MIN_LIVE_N = 10**15
"""The least ``n`` a live event gets: its clock in microseconds, which passed 10**15 in
2001 (the log only ever bumps it up)."""
_LOST = (
    "the live stream restarted (a Redis flush or a long pause); text since the last item is lost"
)


@dataclass
class StreamReader:
    """One reader's place in one thread's stream; ``poll`` and ``apoll`` give what is new."""

    thread_id: str
    store: Store
    live: LiveLog
    after: str | None = None
    refresh_s: float = REFRESH_S
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    """Tells a close made long ago (its live status, if any, long in the log) from one
    whose status may still be on its way."""
    done: bool = False
    """The ``closed`` status was delivered: the stream has ended."""
    place: tuple[int, int] = (0, 0)
    expected: int = 0
    partial: bool = False
    """Chunks were (or may have been) delivered since the last answer (assistant item)."""
    _read: tuple[int, int] = (0, 0)
    _refresh_at: float = field(default=0.0)
    _started: bool = False
    _close_seen_at: float | None = None
    """When the store first showed the thread closed with no live close in the log."""
    _boundary: int = 0
    """The thread's next seq, as the last store read showed it."""
    _checked: bool = False
    _first: tuple[list[StoredItem], ThreadInfo, tuple[int, int] | None] | None = None
    """The store read ``check`` made, which the first round uses instead of its own."""

    def __post_init__(self) -> None:
        if self.after is not None:
            self.place = parse_id(self.after)
            self.partial = self.place[1] > 0  # resuming mid-turn, perhaps: assume text shown
        self._read = self.place
        self.expected = self.place[0]

    def check(self) -> None:
        """Raise ``InvalidStreamId`` unless ``after`` is an id this thread's stream could
        have given out (``UnknownThread`` for no such thread); readers call it before they
        answer, so a made-up id is refused instead of waiting for ever for events past it.

        It reads the store, as the first round would: that round uses this read. An id's
        boundary ``c`` is never past the thread's next seq (a commit is stored before its
        events are numbered), and its ``n`` is 0 (an item), ``CLOSED_N`` or a live event's
        clock in microseconds (``MIN_LIVE_N`` on).
        """
        self._start()
        self._first = self._fetch()
        if self.after is not None:
            c, n = self.place
            live = MIN_LIVE_N <= n <= CLOSED_N
            if not (1 <= c <= self._boundary and (n == 0 or live)):
                raise InvalidStreamId(self.after)
        self._checked = True

    # one round, blocking or async ---------------------------------------------------------

    def poll(self, block_s: float) -> list[StreamEvent]:
        """What is new, waiting up to ``block_s`` for it (less when a refresh is due).

        Whenever the store is read, the log is read after it, without waiting: an item the
        store gives was committed before that log read, so every live event it holds from
        before the commit is in it too, and is delivered first.
        """
        if not self._checked:
            self.check()
        if self._first is not None:
            fetched, self._first = self._first, None
            return self._merge(self.live.read(self.thread_id, self._read, 0.0), fetched)
        if self.clock() < self._refresh_at:
            entries = self.live.read(self.thread_id, self._read, self._block_s(block_s))
            if not self._needs_store(entries):
                return self._merge(entries, None)
        fetched = self._fetch()
        return self._merge(self.live.read(self.thread_id, self._read, 0.0), fetched)

    async def apoll(self, block_s: float) -> list[StreamEvent]:
        """``poll`` for an event loop: the wait holds no thread, the store reads run on one."""
        if not self._checked:
            await asyncio.to_thread(self.check)
        if self._first is not None:
            fetched, self._first = self._first, None
            return self._merge(await self.live.aread(self.thread_id, self._read, 0.0), fetched)
        if self.clock() < self._refresh_at:
            entries = await self.live.aread(self.thread_id, self._read, self._block_s(block_s))
            if not self._needs_store(entries):
                return self._merge(entries, None)
        fetched = await asyncio.to_thread(self._fetch)
        return self._merge(await self.live.aread(self.thread_id, self._read, 0.0), fetched)

    def _start(self) -> None:
        if not self._started:
            self.live.watch(self.thread_id, None)
            self._started = True

    def _block_s(self, block_s: float) -> float:
        return max(0.0, min(block_s, self._refresh_at - self.clock()))

    def _needs_store(self, entries: list[LiveEntry]) -> bool:
        """Whether the log shows a commit whose items it cannot give in order itself."""
        expected = self.expected
        for entry in entries:
            if entry.kind == "item":
                if entry.c - 1 > expected:
                    return True
                expected = max(expected, entry.c)
            elif entry.c > expected:
                return True
        return False

    def _fetch(self) -> tuple[list[StoredItem], ThreadInfo, tuple[int, int] | None]:
        """The store's items from ``expected`` on and the thread; re-marks it watched at
        the boundary the store shows (the log numbers what follows from there)."""
        info = self.store.thread(self.thread_id)
        own = self.store.own_items(self.thread_id)
        items = [s for s in own if s.seq >= self.expected]
        self._boundary = next_seq(info, own)
        self.live.watch(self.thread_id, self._boundary)
        self._refresh_at = self.clock() + self.refresh_s
        closed = self.live.closed_at(self.thread_id) if info.status is ThreadStatus.CLOSED else None
        return items, info, closed

    # merging ------------------------------------------------------------------------------

    def _merge(
        self,
        entries: list[LiveEntry],
        fetched: tuple[list[StoredItem], ThreadInfo, tuple[int, int] | None] | None,
    ) -> list[StreamEvent]:
        if entries:
            last = entries[-1]
            self._read = max(self._read, (last.c, last.n))
        out: list[StreamEvent] = []
        stored = {s.seq: s for s in fetched[0]} if fetched is not None else {}
        for entry in entries:
            if entry.kind == "item":  # the log's copy of a committed item, same id
                seq = entry.c - 1
                if seq >= self.expected and seq not in stored:
                    stored[seq] = StoredItem(
                        seq, "", ItemAdapter.validate_python(entry.data["item"])
                    )
                continue
            self._deliver_items_before(entry.c, stored, out)
            if (entry.c, entry.n) <= self.place or self.done:
                continue
            event = self._event(entry)
            if event is not None:
                self._emit(event, (entry.c, entry.n), out)
        self._deliver_items_before(None, stored, out)
        if fetched is not None and not self.done:
            _, info, closed = fetched
            if info.status is ThreadStatus.CLOSED and (closed is None or closed <= self.place):
                if closed is None and not self._close_lost(info):
                    return out
                synthetic = (self.expected, CLOSED_N)
                if closed is None and synthetic > self.place:  # the live close was lost: say it
                    status = StreamStatus(
                        id=format_id(self.expected, CLOSED_N),
                        status="closed",
                        detail=info.closed_reason or None,
                    )
                    self._emit(status, synthetic, out)
                self.done = True
        return out

    def _close_lost(self, info: ThreadInfo) -> bool:
        """Whether the store's close has waited ``LOST_CLOSE_AFTER_S`` for its live status;
        until then the store is read again when that time is up. A close older than that
        (nobody read the thread then, so no log held its status) is lost at once."""
        age_s = (self.wall_clock() - info.updated_at).total_seconds()
        if age_s > LOST_CLOSE_AFTER_S:
            return True
        now = self.clock()
        if self._close_seen_at is None:
            self._close_seen_at = now
        due = self._close_seen_at + LOST_CLOSE_AFTER_S
        self._refresh_at = min(self._refresh_at, due)
        return now >= due

    def _deliver_items_before(
        self, limit: int | None, stored: dict[int, StoredItem], out: list[StreamEvent]
    ) -> None:
        """Deliver the stored items from ``expected`` on whose id is below ``(limit, 1)``,
        in seq order."""
        for seq in sorted(s for s in stored if s >= self.expected):
            if limit is not None and seq + 1 > limit:
                return
            if self.done:
                return
            item = stored.pop(seq).item
            self._emit(StreamItem(id=format_id(seq + 1, 0), seq=seq, item=item), (seq + 1, 0), out)

    def _event(self, entry: LiveEntry) -> StreamEvent | None:
        eid = format_id(entry.c, entry.n)
        data = entry.data
        match entry.kind:
            case "chunk":
                return StreamChunk(id=eid, text=data["text"])
            case "dispatched":
                return StreamDispatched(id=eid, call_id=data["call_id"], name=data["name"])
            case "status":
                return StreamStatus(
                    id=eid, status=data["status"], detail=data.get("detail") or None
                )
            case "retry":
                return StreamRetry(id=eid, reason=data["reason"])
            case "start" if self.partial:
                return StreamRetry(id=eid, reason=_LOST)
            case _:
                return None  # rejected messages, a start with nothing to drop

    def _emit(self, event: StreamEvent, place: tuple[int, int], out: list[StreamEvent]) -> None:
        out.append(event)
        self.place = place
        match event:
            case StreamItem():
                self.expected = event.seq + 1
                if isinstance(event.item, AssistantTurn):
                    self.partial = False
            case StreamChunk():
                self.partial = True
            case StreamRetry():
                self.partial = False
            case StreamStatus(status="closed"):
                self.done = True


def stream(
    reader: StreamReader, timeout_s: float | None = None, *, block_s: float = 5.0
) -> Iterator[StreamEvent]:
    """Every event of ``reader``'s thread until it closes, or until ``timeout_s`` passes
    with nothing new (``None``: wait for ever)."""
    last_at = time.monotonic()
    while not reader.done:
        wait_s = block_s if timeout_s is None else max(0.0, last_at + timeout_s - time.monotonic())
        events = reader.poll(min(block_s, wait_s))
        if events:
            last_at = time.monotonic()
            yield from events
        elif timeout_s is not None and time.monotonic() - last_at >= timeout_s:
            return


async def astream(
    reader: StreamReader, timeout_s: float | None = None, *, block_s: float = 5.0
) -> AsyncIterator[StreamEvent]:
    """``stream`` for an event loop."""
    last_at = time.monotonic()
    while not reader.done:
        wait_s = block_s if timeout_s is None else max(0.0, last_at + timeout_s - time.monotonic())
        events = await reader.apoll(min(block_s, wait_s))
        if events:
            last_at = time.monotonic()
            for event in events:
                yield event
        elif timeout_s is not None and time.monotonic() - last_at >= timeout_s:
            return


class StreamMethods:
    """Mixed into ``BaseClient``: reading a thread's stream over its ``store`` and
    ``live`` log (docs/streaming.md)."""

    store: Store
    live: LiveLog | None

    def stream(
        self, thread_id: str, after: str | None = None, *, timeout_s: float | None = None
    ) -> Iterator[StreamEvent]:
        """Every event of the thread from the start (or after the event id ``after``):
        committed items, live text, dispatches, status changes; it ends after ``closed``,
        or once ``timeout_s`` passes with nothing new. See docs/streaming.md.

        Raises ``UnknownThread``, and ``InvalidStreamId`` for an ``after`` no stream of the
        thread gave out, here rather than while iterating."""
        reader = self.stream_reader(thread_id, after)
        reader.check()
        return stream(reader, timeout_s)

    def astream(
        self, thread_id: str, after: str | None = None, *, timeout_s: float | None = None
    ) -> AsyncIterator[StreamEvent]:
        """``stream`` for an event loop (ASGI apps): waiting holds no thread. Its first
        step raises what ``stream`` raises at once (the check reads the store)."""
        return astream(self.stream_reader(thread_id, after), timeout_s)

    def stream_reader(self, thread_id: str, after: str | None = None) -> StreamReader:
        """A reader's place in the thread's stream (what ``stream`` and SSE poll); its
        ``check`` refuses an ``after`` no stream gave out, else its first poll does."""
        if self.live is None:
            raise ConfigurationError("this client has no live log to stream from")
        return StreamReader(thread_id, self.store, self.live, after)
