"""What the stream tests share: a model that streams slowly, readers that disconnect at random
and resume, and the check that what a reader saw rebuilds the thread."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from dormant.errors import ModelRetryable
from dormant.messages import AssistantTurn
from dormant.models import Completion, ModelRequest
from dormant.models.base import ChunkSink
from dormant.stores.base import StoredItem
from dormant.streams import (
    StreamChunk,
    StreamEvent,
    StreamItem,
    StreamRetry,
    StreamStatus,
    parse_id,
)

Opener = Callable[[str | None], Iterator[StreamEvent]]
"""Opens a thread's stream after an id (``None``: from the start)."""


@dataclass
class Streamer:
    """Answers ``"answer <n>: w0 w1 ..."`` word by word, ``pause_s`` between words; the first
    ``fail_first`` completions fail half-way (a dropped stream, retried by the slice)."""

    words: int = 40
    pause_s: float = 0.002
    fail_first: int = 0
    name: str = "streamer"
    context_window: int = 128_000
    calls: int = 0

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        self.calls += 1
        turn = sum(1 for item in request.items if item.kind == "user")
        words = [f"answer {turn}:"] + [f" w{i}" for i in range(self.words)]
        for i, word in enumerate(words):
            if self.calls <= self.fail_first and i == len(words) // 2:
                raise ModelRetryable("the stream dropped half-way")
            on_chunk(word)
            time.sleep(self.pause_s)  # a model streaming, not a test waiting for work
        return Completion(text="".join(words))


@dataclass
class Collected:
    events: list[StreamEvent] = field(default_factory=list)
    reconnects: int = 0
    error: BaseException | None = None


def read_all(
    open_stream: Opener, *, seed: int | None = None, into: Collected | None = None
) -> Collected:
    """Read until the stream ends; with ``seed``, drop the connection after a random number
    of events (1 to 6) every time and resume after the last id seen. Events go to ``into``
    as they arrive."""
    rng = random.Random(seed)
    got = into if into is not None else Collected()
    last: str | None = None
    while True:
        budget = rng.randint(1, 6) if seed is not None else -1
        ended = True
        for event in open_stream(last):
            got.events.append(event)
            last = event.id
            budget -= 1
            if budget == 0:
                ended = False
                break
        if ended:
            return got
        got.reconnects += 1


class BackgroundReader:
    """``read_all`` on a thread of its own, started at once; ``got`` fills as it reads."""

    def __init__(self, open_stream: Opener, seed: int | None = None) -> None:
        self.got = Collected()
        self.finished = False

        def run() -> None:
            try:
                read_all(open_stream, seed=seed, into=self.got)
            except BaseException as error:  # re-raised by result()
                self.got.error = error
            self.finished = True

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def count(self, kind: type[StreamEvent]) -> int:  # type: ignore[valid-type]
        return sum(isinstance(e, kind) for e in list(self.got.events))

    def result(self, timeout_s: float) -> Collected:
        self.thread.join(timeout_s)
        assert self.finished, f"the reader did not finish within {timeout_s} s"
        if self.got.error is not None:
            raise self.got.error
        return self.got


def check_rebuilds(
    events: list[StreamEvent], stored: list[StoredItem], *, whole_from: int = 0
) -> list[str]:
    """Assert ``events`` rebuild ``stored`` with no gap and no duplicate, and that the live
    text each assistant item commits is exactly the chunks shown for it since the last
    ``retry`` (a suffix of it for answers begun before ``whole_from`` seq, or after a
    ``retry`` that lost the start). Returns the ``retry`` reasons seen."""
    ids = [parse_id(e.id) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), "ids not strictly increasing"
    items = [e for e in events if isinstance(e, StreamItem)]
    assert [(e.seq, e.item) for e in items] == [(s.seq, s.item) for s in stored]
    retries: list[str] = []
    partial = ""
    lost_start = False
    for event in events:
        match event:
            case StreamChunk():
                partial += event.text
            case StreamRetry():
                retries.append(event.reason)
                lost_start = "lost" in event.reason
                partial = ""
            case StreamItem(item=AssistantTurn() as turn):
                if partial or event.seq >= whole_from:
                    if event.seq >= whole_from and not lost_start:
                        assert partial == turn.text, (event.seq, partial, turn.text)
                    else:
                        assert turn.text.endswith(partial), (event.seq, partial, turn.text)
                partial = ""
                lost_start = False
            case StreamStatus():
                pass
            case _:
                pass
    return retries
