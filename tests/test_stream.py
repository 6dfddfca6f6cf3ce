"""A thread's stream on ``LocalSystem``, over memory, SQLite and PostgreSQL: readers that
disconnect at random and resume after the last id they saw see exactly what an unbroken
reader sees, and what they see rebuilds the stored history and the live text."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from dormant import Agent, LocalSystem, Settings
from dormant.errors import InvalidStreamId, UnknownThread
from dormant.http.stream import sse_response
from dormant.streams import StreamChunk, StreamEvent, StreamRetry, StreamStatus
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


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
