"""Redis is only a cache: flushing dormant's Redis mid-run loses no thread and no message,
and a FLUSHALL of the broker's Redis leaves the workers consuming what is sent after it."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

import pytest
import redis
from conftest import (
    FLUSH_REDIS_DB,
    FLUSH_REDIS_URL,
    REDIS_URL,
    Deployment,
    wait_until,
)

from chaos.services import OwnRedis
from dormant.client import Client
from dormant.errors import DuplicateMessage
from dormant.messages import AssistantTurn, ToolResult

THREADS = 40
FLUSH_TRIES = 5


def _finished(client: Client, thread_id: str) -> bool:
    history = client.history(thread_id)
    return bool(history) and history[-1] == AssistantTurn(text="done: 5")


def _dedicated_redis(prefix: str) -> redis.Redis:
    """Redis database ``FLUSH_REDIS_DB``, refused if anything but this test uses it."""
    conn = redis.Redis.from_url(FLUSH_REDIS_URL)
    foreign = [k for k in conn.scan_iter(count=1000) if not k.decode().startswith(prefix)]
    if foreign:
        reason = (
            f"Redis db {FLUSH_REDIS_DB} holds other keys ({foreign[0]!r}): "
            "point DORMANT_TEST_FLUSH_REDIS_DB at an unused database"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(f"!!! REDIS FLUSH TEST NOT RUN: {reason}")
    return conn


def test_flushing_redis_mid_run_loses_nothing(
    flush_db_alone: None, deploy: Callable[..., Deployment]
) -> None:
    d = deploy(DORMANT_REDIS_URL=FLUSH_REDIS_URL, DORMANT_LEASE_TTL_S="3")
    dormant_redis = _dedicated_redis(d.prefix)
    workers = [d.start_worker("w1"), d.start_worker("w2")]
    d.start_beat()
    d.wait_ready(*workers)
    client = d.client()
    thread_ids: list[str] = []
    # The flush must land while slices run. On a loaded machine a whole batch may finish
    # between the poll and the flush: then the flush proved nothing, and a new batch runs.
    for batch in range(FLUSH_TRIES):
        launched = [
            client.launch("slow_calc", "go", message_id=f"go-{batch}-{i}") for i in range(THREADS)
        ]
        thread_ids += launched
        wait_until(
            lambda launched=launched: sum(_finished(client, t) for t in launched) >= 3,
            30,
            "the first threads to finish",
            check=d.check_alive,
            poll_s=0.02,
        )
        leases_lost = len(dormant_redis.keys(f"{d.prefix}:lease:*"))
        dormant_redis.flushdb()
        if sum(_finished(client, t) for t in launched) < THREADS:
            break
    else:
        pytest.fail(f"every flush came after its batch finished ({leases_lost} leases lost)")

    wait_until(
        lambda: all(_finished(client, t) for t in thread_ids),
        60,
        "every thread to finish after the flush",
        check=d.check_alive,
        poll_s=0.2,
    )
    for n, thread_id in enumerate(thread_ids):
        stored = client.stored_history(thread_id)
        assert [s.item.kind for s in stored] == ["user", "assistant", "tool_result", "assistant"]
        results = Counter(s.item.call_id for s in stored if isinstance(s.item, ToolResult))
        assert list(results.values()) == [1]
        assert len({s.message_id for s in stored}) == len(stored)
        with pytest.raises(DuplicateMessage):  # the dedup set was flushed: SQL still knows
            client.send(thread_id, "go", message_id=f"go-{n // THREADS}-{n % THREADS}")
    dormant_redis.close()


def test_tasks_sent_after_a_broker_flushall_are_consumed_without_a_restart(
    deploy: Callable[..., Deployment], own_redis: OwnRedis
) -> None:
    d = deploy(
        DORMANT_BROKER_URL=own_redis.url,
        DORMANT_REDIS_URL=own_redis.url,
        DORMANT_TEST_REDIS_URL=REDIS_URL,
        DORMANT_LEASE_TTL_S="3",
    )
    worker = d.start_worker("w1", concurrency=4)
    d.wait_ready(worker)
    client = d.client()
    first = client.launch("calc", "go")
    wait_until(lambda: _finished(client, first), 60, "a thread to finish before the flush")
    own_redis.flushall()  # kombu's bindings, the queues, the leases: all gone
    after = [client.launch("calc", "go") for _ in range(4)]
    wait_until(
        lambda: all(_finished(client, t) for t in after),
        60,
        "threads launched after the flush to finish, with no beat and no restart",
        check=d.check_alive,
        poll_s=0.2,
        detail=d.logs,
    )
    assert worker.alive()
