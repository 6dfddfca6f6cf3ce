"""A thread's stream on ``LocalSystem``, over memory, SQLite and PostgreSQL: readers that
disconnect at random and resume after the last id they saw see exactly what an unbroken
reader sees, and what they see rebuilds the stored history and the live text."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from dormant import Agent, LocalSystem, Settings, ToolContext, tool
from dormant.errors import InvalidStreamId, UnknownThread
from dormant.http.stream import sse_response
from dormant.messages import Item, UserText
from dormant.models import Completion, ScriptedModel, call, reply
from dormant.runtime.stream import LOST_CLOSE_AFTER_S, StreamReader
from dormant.stores.memory.live import MemoryLive
from dormant.streams import (
    CLOSED_N,
    LiveEntry,
    StreamChunk,
    StreamDispatched,
    StreamEvent,
    StreamItem,
    StreamRetry,
    StreamStatus,
    format_id,
    parse_id,
)
from tests.conftest import BACKENDS, StoreOpener
from tests.stream_support import BackgroundReader, Streamer, check_rebuilds

TURNS = 4


def _system(open_store: StoreOpener, model: Streamer) -> LocalSystem:
    settings = Settings(chunk_flush_s=0.0, model_backoff_s=0.001, model_backoff_max_s=0.002)
    agent = Agent("streamer", model=model)
    return LocalSystem([agent], settings=settings, store=open_store())


def _opener(system: LocalSystem, thread_id: str):  # type: ignore[no-untyped-def]
    def open_stream(after: str | None) -> Iterator[StreamEvent]:
        return system.stream(thread_id, after, timeout_s=30)

    return open_stream


@pytest.mark.parametrize("open_store", BACKENDS, indirect=True)
@pytest.mark.parametrize("seed", [1, 2])
def test_a_reader_resuming_at_random_points_sees_what_an_unbroken_reader_sees(
    open_store: StoreOpener, seed: int
) -> None:
    with _system(open_store, Streamer()) as system:
        thread_id = system.launch("streamer", "turn 0")
        system.run_until_idle()
        unbroken = BackgroundReader(_opener(system, thread_id))
        broken = BackgroundReader(_opener(system, thread_id), seed=seed)
        wait_for(lambda: unbroken.got.events and broken.got.events, "the readers to start")
        for turn in range(1, TURNS):
            system.send(thread_id, f"turn {turn}")
            system.run_until_idle()
        system.close_thread(thread_id)
        whole = unbroken.result(60)
        resumed = broken.result(60)
        stored = system.stored_history(thread_id)
    assert resumed.reconnects > 5
    assert [e.model_dump() for e in resumed.events] == [e.model_dump() for e in whole.events]
    check_rebuilds(whole.events, stored, whole_from=3)
    assert sum(isinstance(e, StreamChunk) for e in whole.events) > 40 * (TURNS - 1)
    last = whole.events[-1]
    assert isinstance(last, StreamStatus) and last.status == "closed"


def test_a_model_failure_mid_answer_says_retry_and_the_text_starts_again() -> None:
    model = Streamer(fail_first=1)
    opener = _memory
    with opener(model) as system:
        thread_id = system.launch("streamer", "turn 0")
        system.run_until_idle()
        model.calls, model.fail_first = 0, 1
        reader = BackgroundReader(_opener(system, thread_id), seed=7)
        wait_for(lambda: bool(reader.got.events), "the reader to start")
        system.send(thread_id, "turn 1")
        system.run_until_idle()
        system.close_thread(thread_id)
        got = reader.result(60)
        stored = system.stored_history(thread_id)
    retries = check_rebuilds(got.events, stored, whole_from=3)
    assert retries == ["the model's answer was abandoned and is being retried"]
    retry = next(i for i, e in enumerate(got.events) if isinstance(e, StreamRetry))
    assert any(isinstance(e, StreamChunk) for e in got.events[:retry])


def _memory(model: Streamer) -> LocalSystem:
    settings = Settings(chunk_flush_s=0.0, model_backoff_s=0.001, model_backoff_max_s=0.002)
    return LocalSystem([Agent("streamer", model=model)], "memory://", settings=settings)


def test_a_closed_thread_streams_its_history_then_ends() -> None:
    with _memory(Streamer(words=3)) as system:
        thread_id = system.launch("streamer", "hello")
        system.run_until_idle()
        system.close_thread(thread_id, reason="done here")
        events = list(system.stream(thread_id, timeout_s=5))
        again = list(system.stream(thread_id, events[1].id, timeout_s=5))
        after_close = list(system.stream(thread_id, events[-1].id, timeout_s=5))
    assert [e.type for e in events] == ["item", "item", "status"]
    assert events[-1] == StreamStatus(id=events[-1].id, status="closed", detail="done here")
    assert again == events[2:]
    assert after_close == []


def test_an_idle_stream_ends_after_its_timeout_and_bad_input_is_refused() -> None:
    with _memory(Streamer(words=3)) as system:
        thread_id = system.launch("streamer", "hello")
        system.run_until_idle()
        events = list(system.stream(thread_id, timeout_s=0.2))
        assert [e.type for e in events] == ["item", "item"]
        with pytest.raises(InvalidStreamId):
            list(system.stream(thread_id, "12;DROP", timeout_s=0.1))
        with pytest.raises(UnknownThread):
            list(system.stream("thr_nobody", timeout_s=0.1))


def test_a_well_formed_id_no_stream_gave_out_is_refused_at_once() -> None:
    with _memory(Streamer(words=3)) as system:
        thread_id = system.launch("streamer", "hello")
        system.run_until_idle()
        given = [e.id for e in system.stream(thread_id, timeout_s=0.2)]
        boundary = parse_id(given[-1])[0]
        live = format_id(boundary, 1_700_000_000_000_000)  # a live event's: a clock in us
        resumed = [list(system.stream(thread_id, eid, timeout_s=0.2)) for eid in given]
        after_live = list(system.stream(thread_id, live, timeout_s=0.2))
        made_up = ["999999.0", "57.123", f"{boundary}.5", "0.0", f"1.{CLOSED_N + 1}"]
        for event_id in made_up:
            with pytest.raises(InvalidStreamId):
                system.stream(thread_id, event_id, timeout_s=0.1)  # at the call, not later
            with pytest.raises(InvalidStreamId):
                sse_response(system, thread_id, event_id)

        async def first_async_step() -> None:
            async for _ in system.astream(thread_id, "999999.0", timeout_s=0.1):
                pass

        with pytest.raises(InvalidStreamId):
            asyncio.run(first_async_step())
    assert [len(events) for events in resumed] == [1, 0]
    assert {e.type for e in after_live} <= {"retry"}  # accepted: mid-turn, text may be lost


class _Paused(Streamer):
    """A ``Streamer`` that starts when ``begin`` is set and stops after five words until
    ``go`` is."""

    def __init__(self) -> None:
        super().__init__(words=10)
        self.begin, self.halfway, self.go = (threading.Event() for _ in range(3))

    def complete(self, request, on_chunk):  # type: ignore[no-untyped-def]
        def sink(text: str) -> None:
            if text == " w4":
                self.halfway.set()
                assert self.go.wait(30)
            on_chunk(text)

        assert self.begin.wait(30)
        return super().complete(request, sink)


def _live_text_of_a_reader_arriving_halfway(earlier_reader: bool) -> str:
    model = _Paused()
    with _memory(model) as system:
        thread_id = system.launch("streamer", "hi")
        early: list[StreamEvent] = []
        first = system.stream(thread_id, timeout_s=2) if earlier_reader else iter(())
        reading = threading.Thread(target=lambda: early.extend(first))
        reading.start()
        running = threading.Thread(target=system.run_until_idle)
        running.start()
        model.begin.set()
        assert model.halfway.wait(30)
        late = system.stream(thread_id, timeout_s=2)  # no id: it is watching from here
        model.go.set()
        seen = list(late)
        running.join(30)
        reading.join(30)
    assert [e.type for e in seen][-1] == "item"  # the answer, which replaces the live text
    return "".join(e.text for e in seen if isinstance(e, StreamChunk))


def test_a_reader_with_no_id_gets_the_live_text_the_log_holds() -> None:
    alone = _live_text_of_a_reader_arriving_halfway(earlier_reader=False)
    after_another = _live_text_of_a_reader_arriving_halfway(earlier_reader=True)

    assert alone == " w4 w5 w6 w7 w8 w9"  # from the moment it connected: no first words
    assert after_another == "answer 1: w0 w1 w2 w3 w4 w5 w6 w7 w8 w9"  # the log had it all


def test_closing_a_thread_mid_answer_says_retry_then_closed() -> None:
    model = Streamer(words=400, pause_s=0.005)
    with _memory(model) as system:
        thread_id = system.launch("streamer", "turn 0")
        system.run_until_idle(timeout_s=30)
        reader = BackgroundReader(_opener(system, thread_id))
        wait_for(lambda: len(reader.got.events) >= 2, "the reader to see the history")
        system.send(thread_id, "turn 1")
        wait_for(lambda: reader.count(StreamChunk) >= 5, "text to stream")
        system.close_thread(thread_id, reason="enough")
        got = reader.result(30)
    tail = [e.type for e in got.events if e.type != "chunk"][-2:]
    assert tail == ["retry", "status"]
    assert got.events[-1] == StreamStatus(id=got.events[-1].id, status="closed", detail="enough")
    assert isinstance(got.events[-2], StreamRetry)
    assert "closed" in got.events[-2].reason


def test_astream_is_the_same_stream_without_a_thread() -> None:
    with _memory(Streamer(words=20)) as system:
        thread_id = system.launch("streamer", "turn 0")
        system.run_until_idle()
        system.send(thread_id, "turn 1")
        system.run_until_idle()
        system.close_thread(thread_id)

        async def read() -> list[StreamEvent]:
            return [event async for event in system.astream(thread_id, timeout_s=5)]

        events = asyncio.run(read())
        assert events == list(system.stream(thread_id, timeout_s=5))
        assert [e.type for e in events] == ["item"] * 4 + ["status"]


def test_an_idle_sse_body_sends_heartbeats() -> None:
    with _memory(Streamer(words=3)) as system:
        thread_id = system.launch("streamer", "hello")
        system.run_until_idle()
        body = sse_response(system, thread_id, heartbeat_s=0.05).body
        first = [next(body) for _ in range(3)]
        assert first[0] == b"retry: 1000\n\n"
        assert first[1].startswith(b"id: 2.0\nevent: item\ndata: {")
        assert next(body) == b": ping\n\n"
        system.close_thread(thread_id)
        rest = list(body)
        assert rest[-1].startswith(b"id: ") and b"event: status\n" in rest[-1]


def test_new_text_steering_a_slice_away_mid_answer_says_retry() -> None:
    model = Streamer(words=300, pause_s=0.005)
    settings = Settings(chunk_flush_s=0.0, steer_check_s=0.01)
    agent = Agent("streamer", model=model, steering="interrupt")
    with LocalSystem([agent], "memory://", settings=settings) as system:
        thread_id = system.launch("streamer", "turn 0")
        system.run_until_idle(timeout_s=30)
        reader = BackgroundReader(_opener(system, thread_id))
        wait_for(lambda: bool(reader.got.events), "the reader to start")
        system.send(thread_id, "turn 1")
        wait_for(lambda: reader.count(StreamChunk) >= 5, "text to stream")
        system.send(thread_id, "turn 2")  # steers the running slice away
        system.run_until_idle(timeout_s=60)
        system.close_thread(thread_id)
        got = reader.result(30)
        stored = system.stored_history(thread_id)
    retries = check_rebuilds(got.events, stored, whole_from=3)
    assert retries[0] == "the model's answer was abandoned and is being retried"


@tool(deferred=True)
def run_build(target: str, ctx: ToolContext) -> None:
    """Start a build; its result comes later."""


def _builder(history: list[Item]) -> Completion:
    last = history[-1]
    if isinstance(last, UserText) and last.text == "build":
        return reply("starting", call("run_build", target="main"))
    return reply(f"noted: {getattr(last, 'content', getattr(last, 'text', ''))}")


def test_a_live_reader_sees_dispatches_and_what_a_thread_waits_on() -> None:
    agent = Agent("builder", model=ScriptedModel(_builder), tools=[run_build])
    with LocalSystem([agent], "memory://") as system:
        thread_id = system.launch("builder", "hello")
        system.run_until_idle()
        reader = BackgroundReader(_opener(system, thread_id))
        wait_for(lambda: bool(reader.got.events), "the reader to start")
        system.send(thread_id, "build")
        system.run_until_idle()
        wait_for(lambda: reader.count(StreamStatus) >= 1, "the waiting status")
        call_id = next(e.call_id for e in reader.got.events if isinstance(e, StreamDispatched))
        system.deliver(thread_id, call_id, "green")
        system.run_until_idle()
        system.close_thread(thread_id)
        got = reader.result(30)
        stored = system.stored_history(thread_id)
    check_rebuilds(got.events, stored, whole_from=3)
    live = [e for e in got.events if not isinstance(e, (StreamItem, StreamChunk))]
    assert [(e.type, getattr(e, "status", None)) for e in live] == [
        ("status", "waiting"),
        ("dispatched", None),
        ("status", "idle"),
        ("status", "closed"),
    ]
    assert live[0] == StreamStatus(
        id=live[0].id, status="waiting", detail=f"on run_build ({call_id})"
    )
    assert live[1] == StreamDispatched(id=live[1].id, call_id=call_id, name="run_build")


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class _CloseNotYetLive:
    """The live log as a reader sees it between a close's commit and its live status:
    everything but the ``closed`` status, while ``held``."""

    def __init__(self, live: MemoryLive) -> None:
        self.live = live
        self.held = True

    def watch(self, thread_id: str, c: int | None) -> None:
        self.live.watch(thread_id, c)

    def read(self, thread_id: str, after: tuple[int, int], block_s: float) -> list[LiveEntry]:
        entries = self.live.read(thread_id, after, block_s)
        if not self.held:
            return entries
        return [e for e in entries if e.data.get("status") != "closed"]

    def closed_at(self, thread_id: str) -> tuple[int, int] | None:
        return None if self.held else self.live.closed_at(thread_id)


def test_a_reader_of_a_thread_closed_a_while_ago_gets_its_closed_status_at_once() -> None:
    """Nobody read the thread when it closed, so its live log never held the status; a
    reader that comes later says the close from the store without waiting
    ``LOST_CLOSE_AFTER_S`` for a live status that cannot come (a dashboard page of a closed
    thread, an SSE client reconnecting to one, each waited 2 s for its end)."""
    with _memory(Streamer(words=3)) as system:
        thread_id = system.launch("streamer", "hello")
        system.run_until_idle()
        system.close_thread(thread_id, reason="done here")
        system.run_until_idle()
        closed_at = system.thread(thread_id).updated_at
        later = closed_at + timedelta(seconds=LOST_CLOSE_AFTER_S + 1)
        reader = StreamReader(thread_id, system.store, system.live, wall_clock=lambda: later)
        events = reader.poll(0.0)
    assert [e.type for e in events] == ["item", "item", "status"], events
    assert events[-1].status == "closed" and reader.done  # type: ignore[union-attr]


def test_a_reader_between_a_close_and_its_live_status_waits_for_the_status() -> None:
    """The store shows a close a moment before its live status reaches the log. A reader
    that reads the store in that moment delivers the live status when it comes (the id
    every other reader gets), and says the close itself only when none came for
    ``LOST_CLOSE_AFTER_S`` (a Redis flush, a crash between the two)."""
    now = [0.0]
    with _memory(Streamer(words=3)) as system:
        thread_id = system.launch("streamer", "hello")
        system.run_until_idle()
        late, lost = _CloseNotYetLive(system.live), _CloseNotYetLive(system.live)
        readers = [
            StreamReader(thread_id, system.store, log, clock=lambda: now[0])  # type: ignore[arg-type]
            for log in (late, lost)
        ]
        assert all(r.poll(0.0) for r in readers)  # the history so far; each watches the thread
        system.close_thread(thread_id, reason="done here")
        now[0] += readers[0].refresh_s  # each reads the store again: closed, no live status
        assert [r.poll(0.0) for r in readers] == [[], []]
        assert not any(r.done for r in readers)

        late.held = False
        (status,) = readers[0].poll(0.0)
        assert status == StreamStatus(
            id=format_id(*system.live.closed_at(thread_id)),  # type: ignore[misc]
            status="closed",
            detail="done here",
        )
        assert readers[0].done

        now[0] += LOST_CLOSE_AFTER_S / 2
        assert readers[1].poll(0.0) == [] and not readers[1].done
        now[0] += LOST_CLOSE_AFTER_S / 2
        (said,) = readers[1].poll(0.0)
    assert said.type == "status" and said.status == "closed"  # type: ignore[union-attr]
    assert parse_id(said.id)[1] == CLOSED_N and readers[1].done
