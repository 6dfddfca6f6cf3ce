"""A thread's stream: the typed events a reader sees, their ids, and the live log behind them.

An event id is ``"<c>.<n>"``. ``c`` is a boundary in the thread's committed history: the
seq the next item would get when the event happened. A committed item of seq ``k`` has the
id ``"<k+1>.0"``; a live event (a chunk, a dispatch, a status change) published while the
boundary was ``k+1`` has ``"<k+1>.<n>"`` with ``n >= 1``, taken from Redis's clock in
microseconds (or the process's, for ``LocalSystem``) and bumped to stay strictly
increasing. Ids compare as the pair ``(c, n)``, so:

- committed items always come from the store, by seq: a reader resuming after ``"c.n"``
  gets every item of seq ``>= c``, whatever Redis lost;
- live events come from a capped log per thread (``LiveLog``) that exists only while
  someone reads the thread (``watch``), so an unwatched thread costs what it did before;
- after a Redis flush or a worker crash the live log starts again with ``n`` from a later
  clock, so ids stay monotonic, and a ``retry`` tells the reader to drop partial text.

Readers treat ids as opaque strings; ``parse_id`` and ``format_id`` are the only places
that know their shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from dormant.errors import InvalidStreamId
from dormant.messages import Item

__all__ = [
    "CLOSED_N",
    "LiveEntry",
    "LiveLog",
    "StreamChunk",
    "StreamDispatched",
    "StreamEvent",
    "StreamEventAdapter",
    "StreamItem",
    "StreamRetry",
    "StreamStatus",
    "format_id",
    "parse_id",
]

CLOSED_N = 2**62
"""The ``n`` of a ``closed`` status the reader derives from the store when the live one was
lost (a Redis flush): nothing follows a close, so it may take the last place of its ``c``."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class StreamChunk(_Frozen):
    """Live model text, not yet committed; the ``item`` that commits it supersedes it."""

    type: Literal["chunk"] = "chunk"
    id: str
    text: str


class StreamItem(_Frozen):
    """A committed history item, from the store."""

    type: Literal["item"] = "item"
    id: str
    seq: int
    item: Item


class StreamDispatched(_Frozen):
    """A tool call sent off to run."""

    type: Literal["dispatched"] = "dispatched"
    id: str
    call_id: str
    name: str


class StreamStatus(_Frozen):
    """The thread's status changed; the stream ends after ``closed``."""

    type: Literal["status"] = "status"
    id: str
    status: str
    detail: str | None = None


class StreamRetry(_Frozen):
    """The turn being streamed was abandoned (a worker died, the model failed, the live log
    was lost): drop the partial text shown since the last ``item``."""

    type: Literal["retry"] = "retry"
    id: str
    reason: str


StreamEvent = Annotated[
    StreamChunk | StreamItem | StreamDispatched | StreamStatus | StreamRetry,
    Field(discriminator="type"),
]
StreamEventAdapter: TypeAdapter[StreamEvent] = TypeAdapter(StreamEvent)


def format_id(c: int, n: int) -> str:
    return f"{c}.{n}"


def parse_id(event_id: str) -> tuple[int, int]:
    """``(c, n)`` of an event id; ``InvalidStreamId`` if it is not one."""
    c, dot, n = event_id.strip().partition(".")
    valid = dot and c.isascii() and c.isdigit() and n.isascii() and n.isdigit()
    if not valid or len(c) > 18 or len(n) > 20:
        raise InvalidStreamId(event_id)
    return int(c), int(n)


@dataclass(frozen=True, slots=True)
class LiveEntry:
    """One entry of a thread's live log: its id, what it is and its data.

    ``kind`` is an event kind (``chunk``, ``item``, ``dispatched``, ``status``,
    ``rejected``), ``retry`` (written by the log itself when an attempt is abandoned) or
    ``start`` (the log began: after a flush, it says partial text may be lost).
    """

    c: int
    n: int
    kind: str
    data: dict[str, Any]


class LiveLog(Protocol):
    """The live part of every watched thread's stream (``RedisLive``, ``MemoryLive``).

    Writers (the slice's event sink) append only while a thread is watched. ``watch``
    marks it watched for a while and tells the log the committed boundary the reader saw
    in the store, so the log numbers what follows from there.
    """

    def watch(self, thread_id: str, c: int | None) -> None: ...

    def read(self, thread_id: str, after: tuple[int, int], block_s: float) -> list[LiveEntry]:
        """Entries after ``after``, oldest first, waiting up to ``block_s`` for one."""
        ...

    async def aread(
        self, thread_id: str, after: tuple[int, int], block_s: float
    ) -> list[LiveEntry]:
        """``read`` without holding a thread while it waits."""
        ...

    def closed_at(self, thread_id: str) -> tuple[int, int] | None:
        """The id of the live ``closed`` status, if the log holds one."""
        ...
