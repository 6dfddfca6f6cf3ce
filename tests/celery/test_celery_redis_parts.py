"""The Redis parts on a real Redis: lease, dedup fast path, wake marks, live events."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import OwnRedis, wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

from dormant.messages import Chunk, ItemAdded, UserText
from dormant.stores.base import Priority
from dormant.stores.redis import (
    RedisDedup,
    RedisEvents,
    RedisLease,
    RedisSliceEnd,
    RedisWakeMarks,
)


@pytest.fixture
def prefix(redis_server: redis.Redis) -> Iterator[str]:
    prefix = f"dct{secrets.token_hex(5)}"
    yield prefix
    keys = list(redis_server.scan_iter(match=f"{prefix}*"))
    if keys:
        redis_server.delete(*keys)


def test_the_lease_is_exclusive_and_only_its_holder_renews_or_releases_it(
    redis_server: redis.Redis, prefix: str
) -> None:
    lease = RedisLease(redis_server, prefix)
    token = lease.acquire("t1", 30)
    assert token is not None and lease.held("t1")
    assert lease.acquire("t1", 30) is None
    assert not lease.renew("t1", "not-the-token", 30)
    lease.release("t1", "not-the-token")
    assert lease.held("t1")
    assert lease.renew("t1", token, 30)
    lease.release("t1", token)
    assert not lease.held("t1")
    assert lease.acquire("t1", 30) is not None


def test_an_expired_lease_taken_by_another_cannot_be_renewed_or_released(
    redis_server: redis.Redis, prefix: str
) -> None:
    lease = RedisLease(redis_server, prefix)
    old = lease.acquire("t1", 0.05)
    assert old is not None
    wait_until(lambda: not lease.held("t1"), 5, "the lease to expire")
    new = lease.acquire("t1", 30)
    assert new is not None
    assert not lease.renew("t1", old, 30)
    lease.release("t1", old)
    assert lease.held("t1")


def test_the_dedup_set_expires_and_reads_unseen_when_redis_is_gone(
    redis_server: redis.Redis, prefix: str
) -> None:
    dedup = RedisDedup(redis_server, prefix, ttl_s=60)
    dedup.add("t1", ["m1", "m2"])
    assert dedup.seen("t1", "m1") and not dedup.seen("t1", "m3") and not dedup.seen("t2", "m1")
    assert 0 < redis_server.pttl(f"{prefix}:dedup:t1") <= 60_000
    gone = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    down = RedisDedup(gone, prefix, ttl_s=60)
    assert not down.seen("t1", "m1")  # SQL's unique key decides instead
    down.add("t1", ["m1"])  # logged, not raised: the commit already happened


def test_a_wake_mark_admits_one_waker_per_priority_until_cleared(
    redis_server: redis.Redis, prefix: str
) -> None:
    marks = RedisWakeMarks(redis_server, prefix, ttl_s=30)
    assert marks.claim("t1", Priority.BACKGROUND)
    assert not marks.claim("t1", Priority.BACKGROUND)
    assert not marks.claim("t1", 0)  # the queued slice is more urgent than the sweeper's
    assert marks.claim("t1", Priority.INTERACTIVE)  # user text does not wait behind it
    assert not marks.claim("t1", Priority.INTERACTIVE)
    assert not marks.claim("t1", Priority.BACKGROUND)
    assert marks.claim("t2", Priority.BACKGROUND)
    marks.clear("t1")
    assert marks.claim("t1", 0)


def test_events_are_published_and_the_recent_ones_kept_without_chunks(
    redis_server: redis.Redis, prefix: str
) -> None:
    events = RedisEvents(redis_server, prefix, keep=3)
    pubsub = redis_server.pubsub()
    pubsub.subscribe(events.channel("t1"))
    wait_until(lambda: pubsub.get_message(timeout=0.1), 5, "the subscription")
    for seq in range(1, 6):
        events.publish(ItemAdded(thread_id="t1", seq=seq, item=UserText(text=f"m{seq}")))
    events.publish(Chunk(thread_id="t1", text="partial"))

    assert [e.seq for e in events.recent("t1") if isinstance(e, ItemAdded)] == [3, 4, 5]
    assert events.recent("t2") == []
    received: list[str] = []

    def drained() -> bool:
        while (message := pubsub.get_message()) is not None:
            received.append(json.loads(message["data"])["kind"])
        return len(received) >= 6

    wait_until(drained, 5, "the published events")
    assert received == ["item"] * 5 + ["chunk"]
    pubsub.close()


def test_a_refused_acquire_is_reported_by_the_holders_release_once(
    redis_server: redis.Redis, prefix: str
) -> None:
    lease = RedisLease(redis_server, prefix)
    token = lease.acquire("t1", 30)
    assert token is not None
    assert lease.release("t1", token) is False  # nobody asked meanwhile: no SQL re-check
    token = lease.acquire("t1", 30)
    assert token is not None
    assert lease.acquire("t1", 30) is None  # a slice woken meanwhile ends at once...
    assert lease.release("t1", token) is True  # ...and its holder is told to drain
    token = lease.acquire("t1", 30)
    assert token is not None
    assert lease.release("t1", token) is False  # the refusal was consumed


def test_taking_the_lease_clears_the_wake_mark_even_when_refused(
    redis_server: redis.Redis, prefix: str
) -> None:
    marks = RedisWakeMarks(redis_server, prefix, ttl_s=30)
    lease = RedisLease(redis_server, prefix, wake_marks=marks)
    assert marks.claim("t1", Priority.BACKGROUND)
    token = lease.acquire("t1", 30)
    assert token is not None
    assert marks.claim("t1", Priority.BACKGROUND)  # the started slice no longer suppresses
    assert lease.acquire("t1", 30) is None
    assert marks.claim("t1", Priority.BACKGROUND)


def test_a_slice_ends_in_one_command_with_each_event_its_own_message(
    redis_server: redis.Redis, prefix: str
) -> None:
    lease = RedisLease(redis_server, prefix)
    dedup = RedisDedup(redis_server, prefix, ttl_s=60)
    events = RedisEvents(redis_server, prefix, keep=10)
    ending = RedisSliceEnd(redis_server, lease, dedup, events)
    pubsub = redis_server.pubsub()
    pubsub.subscribe(events.channel("t1"))
    wait_until(lambda: pubsub.get_message(timeout=0.1), 5, "the subscription")
    token = lease.acquire("t1", 30)
    assert token is not None
    sent = [
        Chunk(thread_id="t1", text="tail"),
        ItemAdded(thread_id="t1", seq=1, item=UserText(text="hi")),
        ItemAdded(thread_id="t1", seq=2, item=UserText(text="there")),
    ]
    commands: list[str] = []
    execute = redis.Redis.execute_command

    def counted(client: redis.Redis, *args: object, **options: object) -> object:
        commands.append(str(args[0]))
        return execute(client, *args, **options)

    ending.end("t0", "no lease", [], [])  # loads the script: once per Redis
    redis.Redis.execute_command = counted  # type: ignore[method-assign]
    try:
        refused = ending.end("t1", token, ["m1"], sent)
    finally:
        redis.Redis.execute_command = execute  # type: ignore[method-assign]

    assert refused is False and commands == ["EVALSHA"]
    assert not lease.held("t1") and dedup.seen("t1", "m1")
    assert [e.seq for e in events.recent("t1") if isinstance(e, ItemAdded)] == [1, 2]
    assert _received_kinds(pubsub, 3, "the published events") == ["chunk", "item", "item"]
    pubsub.close()


def test_a_slice_nobody_watches_publishes_once_yet_keeps_its_events(
    own_redis: OwnRedis,
) -> None:
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    prefix = "ends"
    lease = RedisLease(client, prefix)
    events = RedisEvents(client, prefix, keep=10)
    ending = RedisSliceEnd(client, lease, RedisDedup(client, prefix, 60), events)
    watcher = client.pubsub()
    watcher.psubscribe(events.channel("watched*"))  # a pattern subscriber is a watcher
    wait_until(lambda: watcher.get_message(timeout=0.1), 5, "the subscription")

    def publishes() -> int:
        return int(client.info("commandstats").get("cmdstat_publish", {}).get("calls", 0))

    counts = []
    for thread_id in ("unwatched", "watched"):
        token = lease.acquire(thread_id, 30)
        assert token is not None
        items = [ItemAdded(thread_id=thread_id, seq=n, item=UserText(text="hi")) for n in (1, 2)]
        before = publishes()
        assert not ending.end(thread_id, token, [], [Chunk(thread_id=thread_id, text="c"), *items])
        counts.append(publishes() - before)

    assert counts == [1, 3]
    assert [e.kind for e in events.recent("unwatched")] == ["item", "item"]
    watched = _received_kinds(watcher, 3, "the watched thread's events")
    assert watched == ["chunk", "item", "item"]
    watcher.close()
    client.close()


def _received_kinds(pubsub: Any, count: int, what: str) -> list[str]:
    """The kinds of the first ``count`` events ``pubsub`` receives, polled with a deadline."""
    received: list[str] = []

    def drained() -> bool:
        while (message := pubsub.get_message()) is not None:
            received.append(json.loads(message["data"])["kind"])
        return len(received) >= count

    wait_until(drained, 5, what)
    return received
