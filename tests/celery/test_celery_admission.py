"""Admission control on a real worker and beat: a burst of threads against a local
OpenAI-compatible server that allows a small RPM and answers 429 with ``Retry-After`` past
it. With ``DORMANT_RATE_LIMITS`` set, the workers share one bucket in Redis: every thread
finishes, the server sees almost no 429, no worker slot sleeps waiting for capacity, and
user text sent while the burst queues is answered before the burst is done."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from conftest import Deployment, wait_until

from dormant.messages import UserMessage
from dormant.stores.base import InboxState, NewThread, Priority
from dormant.stores.redis_limiter import RedisLimiter
from tests.fake_providers import FakeProvider, Recorded, Reply, openai_error, openai_stream

RPM = 120
BURST = 150
"""Threads launched at once: more than a minute's requests, so some must wait."""


class RateLimitedProvider(FakeProvider):
    """An OpenAI-compatible server enforcing ``rpm`` as a token bucket (as providers
    document theirs): past it, a 429 with the exact ``Retry-After`` of its next request."""

    def __init__(self, rpm: float) -> None:
        super().__init__("/v1/chat/completions", base_path="/v1")
        self.rpm = rpm
        self.level = rpm
        self.at = time.monotonic()
        self.refused = 0
        self.answered = 0
        self._bucket = threading.Lock()

    def take(self, request: Recorded) -> Reply:
        with self._bucket:
            now = time.monotonic()
            self.level = min(self.rpm, self.level + (now - self.at) * self.rpm / 60)
            self.at = now
            if self.level < 1:
                self.refused += 1
                wait_s = (1 - self.level) * 60 / self.rpm
                headers = {"retry-after-ms": str(int(wait_s * 1000) + 1)}
                return openai_error(429, "rate limit reached for requests", headers)
            self.level -= 1
            self.answered += 1
        return openai_stream(["done"], usage=(40, 1, 0))


def test_a_burst_past_the_providers_rpm_finishes_with_almost_no_429_and_users_first(
    deploy: Callable[..., Deployment],
) -> None:
    with RateLimitedProvider(RPM) as server:
        limits = {server.base_url: {"rpm": RPM}}
        d = deploy(
            DORMANT_AGENTS="admission_agents",
            TEST_FAKE_OPENAI_URL=server.base_url,
            DORMANT_RATE_LIMITS=json.dumps(limits),
        )
        worker = d.start_worker("w1", concurrency=8)
        beat = d.start_beat()
        d.wait_ready(worker)
        client = d.client()
        # a webhook burst: background threads, woken by beat's sweep as they appear
        ids = [f"thr_burst_{d.prefix}_{n}" for n in range(BURST)]
        for thread_id in ids:
            first = (f"launch:{thread_id}", UserMessage(text="go"), Priority.BACKGROUND)
            client.store.create_thread(NewThread(id=thread_id, agent="limited", messages=[first]))

        def finished(threads: list[str]) -> bool:
            return all(
                row.state is InboxState.DONE for t in threads for row in client.store.inbox(t)
            )

        limiter = RedisLimiter(d.redis, d.prefix)
        wait_until(lambda: limiter.counters()["deferred"], 60, "the burst to spend the limit")
        # user text now: admitted from the reserve, ahead of the queued background threads
        sent = time.monotonic()
        users = [client.launch("limited", f"a user asks {n}") for n in range(3)]
        wait_until(lambda: finished(users), 30, "the users' threads", check=d.check_alive)
        users_s = time.monotonic() - sent
        assert not finished(ids), "the burst finished before the users were answered"
        wait_until(
            lambda: finished(ids),
            90,
            "every thread of the burst to finish",
            check=d.check_alive,
            poll_s=0.5,
            detail=lambda: f" (server answered {server.answered}, refused {server.refused})",
        )
        assert beat.alive()
        counters = limiter.counters()
        print(f"{BURST} threads at {RPM} RPM: {server.refused} 429s, counters {counters},")
        print(f"3 users answered {users_s:.2f} s after sending, while the burst queued")
    assert server.answered == BURST + len(users)
    assert server.refused <= 2, f"{server.refused} 429s"
    # a minute's requests went at once; the rest (less what refilled while beat woke them,
    # a hundred a sweep) waited outside the worker slots
    assert counters["deferred"] >= 1 and counters["refused"] == counters["deferred"]
    assert counters["asleep_s"] == 0  # and no slot slept for capacity
    for thread_id in ids:
        assert [i.kind for i in client.history(thread_id)] == ["user", "assistant"]


def test_threads_a_killed_worker_was_to_wake_at_their_places_are_woken_by_the_sweeper(
    deploy: Callable[..., Deployment],
) -> None:
    """Issue 35: a deferred thread is woken at its place by its slice's Celery retry (a
    countdown held by the worker that deferred it), and the sweeper wakes it only
    ``PLACE_BACKSTOP_S`` after its place, as a backstop. Kill that worker (SIGKILL) while it
    holds the retries, start another: every thread still gets its one answer, from the
    sweeper's backstop (the broker would redeliver the unacknowledged retries only after
    its visibility timeout, an hour)."""
    rpm = 30  # places two seconds apart: every deferral is a countdown the worker holds
    burst = 12
    with RateLimitedProvider(rpm) as server:
        d = deploy(
            DORMANT_AGENTS="admission_agents",
            TEST_FAKE_OPENAI_URL=server.base_url,
            DORMANT_RATE_LIMITS=json.dumps({server.base_url: {"rpm": rpm}}),
            # a slice killed in its model call holds its lease (and its admission slot)
            # until this passes: not the 30 s default, which would outlast the wait
            DORMANT_LEASE_TTL_S="5",
        )
        first_worker = d.start_worker("w1", concurrency=4)
        d.start_beat()
        d.wait_ready(first_worker)
        client = d.client()
        ids = [client.launch("limited", "go", priority="background") for _ in range(burst)]
        limiter = RedisLimiter(d.redis, d.prefix)
        wait_until(
            lambda: limiter.counters()["deferred"] >= burst // 2, 60, "the burst to be deferred"
        )
        d.expected_deaths.add(first_worker.name)
        first_worker.kill()  # with its countdown retries, unacknowledged
        waiting = [t for t in ids if client.thread(t).retry_at is not None]
        assert waiting, "no thread was waiting for its place when the worker died"
        second_worker = d.start_worker("w2", concurrency=4)
        d.wait_ready(second_worker)
        wait_until(
            lambda: all(row.state is InboxState.DONE for t in ids for row in client.store.inbox(t)),
            90,
            "every thread of the burst to be answered after the kill",
            poll_s=0.5,
        )
    for thread_id in ids:
        assert [i.kind for i in client.history(thread_id)] == ["user", "assistant"]
    # a slice killed in its model call runs it again: the history still has one answer
    assert burst <= server.answered <= burst + 4


def test_parked_launches_are_woken_by_the_sweeper_when_their_waker_dies_and_redis_is_flushed(
    deploy: Callable[..., Deployment],
) -> None:
    """Issue 35: a background launch whose line queues is parked (its place taken without a
    slice, nothing sent to the broker) and the slice admitted before it wakes it at its
    turn with a countdown. Kill the worker holding those countdowns (SIGKILL) and flush
    Redis (the places, the parked set, the line): SQL's stored "not before" is all that is
    left, and the sweeper still wakes every parked thread to its one answer."""
    rpm = 30  # places two seconds apart
    with RateLimitedProvider(rpm) as server:
        d = deploy(
            DORMANT_AGENTS="admission_agents",
            TEST_FAKE_OPENAI_URL=server.base_url,
            DORMANT_RATE_LIMITS=json.dumps({server.base_url: {"rpm": rpm}}),
            DORMANT_LEASE_TTL_S="5",  # a slice killed in its model call: see above
        )
        first_worker = d.start_worker("w1", concurrency=4)
        d.start_beat()
        d.wait_ready(first_worker)
        client = d.client()
        limiter = RedisLimiter(d.redis, d.prefix)
        ids = [client.launch("limited", "go", priority="background") for _ in range(3)]
        wait_until(lambda: limiter.counters()["deferred"] >= 1, 60, "the line to queue")
        ids += [client.launch("limited", "go", priority="background") for _ in range(9)]
        assert limiter.counters()["parked"] >= 8, limiter.counters()
        wait_until(lambda: server.answered >= 4, 60, "a parked thread woken in its turn")
        d.expected_deaths.add(first_worker.name)
        first_worker.kill()  # with the countdowns of the next parked threads
        _flush(d)  # and every place, parked set and line with them
        second_worker = d.start_worker("w2", concurrency=4)
        d.wait_ready(second_worker)
        wait_until(
            lambda: all(row.state is InboxState.DONE for t in ids for row in client.store.inbox(t)),
            120,
            "every parked thread to be answered after the kill and the flush",
            poll_s=0.5,
        )
    for thread_id in ids:
        assert [i.kind for i in client.history(thread_id)] == ["user", "assistant"]
    assert len(ids) <= server.answered <= len(ids) + 4  # a slice killed mid-call calls again


def test_flushing_redis_mid_burst_resets_the_limits_and_loses_no_thread(
    deploy: Callable[..., Deployment],
) -> None:
    with RateLimitedProvider(RPM) as server:
        d = deploy(
            DORMANT_AGENTS="admission_agents",
            TEST_FAKE_OPENAI_URL=server.base_url,
            DORMANT_RATE_LIMITS=json.dumps({server.base_url: {"rpm": RPM}}),
        )
        worker = d.start_worker("w1", concurrency=8)
        d.start_beat()
        d.wait_ready(worker)
        client = d.client()
        ids = [f"thr_flush_{d.prefix}_{n}" for n in range(BURST)]
        for thread_id in ids:
            first = (f"launch:{thread_id}", UserMessage(text="go"), Priority.BACKGROUND)
            client.store.create_thread(NewThread(id=thread_id, agent="limited", messages=[first]))
        limiter = RedisLimiter(d.redis, d.prefix)
        wait_until(lambda: limiter.counters()["deferred"], 60, "the burst to spend the limit")
        _flush(d)  # buckets, slots, queue places, leases, wake marks: all gone
        wait_until(
            lambda: all(row.state is InboxState.DONE for t in ids for row in client.store.inbox(t)),
            120,
            "every thread of the burst to finish after the flush",
            check=d.check_alive,
            poll_s=0.5,
        )
        counters = limiter.counters()
        print(f"flushed mid-burst: {server.refused} 429s, counters since the flush {counters}")
    # The flush took the leases of the slices in their model call at that moment: another
    # slice may take such a thread and call its model again (the version guard keeps one
    # answer). At most one repeat a slice in flight, so at most the worker's concurrency.
    assert BURST <= server.answered <= BURST + 8
    assert counters["asleep_s"] == 0  # 429s after the flush defer too: no slot sleeps
    for thread_id in ids:  # each thread's one completion, none lost or doubled
        assert [i.kind for i in client.history(thread_id)] == ["user", "assistant"]


def _flush(d: Deployment) -> None:
    """What a FLUSHALL of dormant's Redis does to this deployment (the shared server's
    other keys, and the broker's queues of this deployment, stay)."""
    broker = f"{d.prefix}:broker:"
    keys = [k for k in d.redis.scan_iter(match=f"{d.prefix}:*") if not k.startswith(broker)]
    if keys:
        d.redis.delete(*keys)
