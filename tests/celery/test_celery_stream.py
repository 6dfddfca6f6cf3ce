"""A thread's stream on real Celery workers: a worker SIGKILLed half-way through an answer,
or dormant's Redis flushed half-way, and readers that drop their connection at random and
resume still rebuild the stored history, with a ``retry`` where the partial text died."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
import redis
from conftest import FLUSH_REDIS_DB, FLUSH_REDIS_URL, Deployment, wait_until

from dormant.client import Client
from dormant.messages import AssistantTurn
from dormant.runtime.stream import StreamReader, stream
from dormant.streams import StreamChunk, StreamEvent, StreamRetry
from tests.stream_support import BackgroundReader, check_rebuilds


def _answered(client: Client, thread_id: str, turns: int) -> bool:
    return sum(isinstance(item, AssistantTurn) for item in client.history(thread_id)) >= turns


def _opener(client: Client, thread_id: str) -> Callable[[str | None], Iterator[StreamEvent]]:
    def open_stream(after: str | None) -> Iterator[StreamEvent]:
        assert client.live is not None
        reader = StreamReader(thread_id, client.store, client.live, after, refresh_s=1.0)
        return stream(reader, timeout_s=120)

    return open_stream


def _start_readers(client: Client, thread_id: str) -> tuple[BackgroundReader, BackgroundReader]:
    """An unbroken reader and one that resumes at random, both past the history so far."""
    unbroken = BackgroundReader(_opener(client, thread_id))
    broken = BackgroundReader(_opener(client, thread_id), seed=11)
    wait_until(
        lambda: unbroken.got.events and broken.got.events, 30, "the readers to see the history"
    )
    return unbroken, broken


def test_a_worker_killed_mid_answer_streams_retry_then_the_answer(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_LEASE_TTL_S="3")
    doomed = d.start_worker("doomed", concurrency=2)
    d.start_beat()
    d.wait_ready(doomed)
    client = d.client()
    thread_id = client.launch("streamer", "turn 0")
    wait_until(lambda: _answered(client, thread_id, 1), 60, "the first answer", check=d.check_alive)
    unbroken, broken = _start_readers(client, thread_id)
    client.send(thread_id, "turn 1")
    wait_until(lambda: unbroken.count(StreamChunk) >= 10, 60, "text to stream", check=d.check_alive)
    d.expected_deaths.add("doomed")
    doomed.kill()
    survivor = d.start_worker("survivor", concurrency=2)
    d.wait_ready(survivor)
    wait_until(
        lambda: _answered(client, thread_id, 2),
        90,
        "the answer after the kill",
        check=d.check_alive,
    )
    client.close_thread(thread_id)
    whole, resumed = unbroken.result(60), broken.result(60)
    stored = client.stored_history(thread_id)
    assert resumed.reconnects > 5
    assert [e.model_dump() for e in resumed.events] == [e.model_dump() for e in whole.events]
    retries = check_rebuilds(whole.events, stored, whole_from=3)
    assert retries == ["the model's answer was abandoned and is being retried"]


def test_a_redis_flush_mid_answer_streams_retry_and_loses_no_item(
    flush_db_alone: None, deploy: Callable[..., Deployment]
) -> None:
    d = deploy(DORMANT_REDIS_URL=FLUSH_REDIS_URL, DORMANT_LEASE_TTL_S="3")
    dormant_redis = redis.Redis.from_url(FLUSH_REDIS_URL)
    foreign = [
        k for k in dormant_redis.scan_iter(count=1000) if not k.decode().startswith(d.prefix)
    ]
    if foreign:
        reason = f"Redis db {FLUSH_REDIS_DB} holds other keys ({foreign[0]!r})"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(f"!!! REDIS FLUSH STREAM TEST NOT RUN: {reason}")
    worker = d.start_worker("w1", concurrency=2)
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    thread_id = client.launch("streamer", "turn 0")
    wait_until(lambda: _answered(client, thread_id, 1), 60, "the first answer", check=d.check_alive)
    unbroken, broken = _start_readers(client, thread_id)
    client.send(thread_id, "turn 1")
    wait_until(lambda: unbroken.count(StreamChunk) >= 10, 60, "text to stream", check=d.check_alive)
    dormant_redis.flushdb()
    wait_until(
        lambda: _answered(client, thread_id, 2),
        90,
        "the answer after the flush",
        check=d.check_alive,
    )
    client.send(thread_id, "turn 2")
    wait_until(lambda: _answered(client, thread_id, 3), 90, "one more answer", check=d.check_alive)
    client.close_thread(thread_id)
    stored = client.stored_history(thread_id)
    for reader in (unbroken, broken):
        got = reader.result(60)
        retries = check_rebuilds(got.events, stored, whole_from=3)
        assert any("lost" in reason for reason in retries), retries
        assert got.events[-1].type == "status"
    assert unbroken.count(StreamRetry) >= 1
    dormant_redis.close()
