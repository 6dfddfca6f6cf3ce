"""The shared admission bucket on a real Redis: one Lua script per step, atomic across
every worker (``stores/redis_limiter.py``), and a deferred thread surviving a flush."""

from __future__ import annotations

import functools
import itertools
import math
import multiprocessing
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import redis
from admission_hammer import hammer
from conftest import REDIS_URL, wait_until

from dormant import Agent
from dormant.messages import UserMessage
from dormant.models import RateLimit, ScriptedModel, reply
from dormant.rate_limit import ProviderLimits
from dormant.runtime.limiter import Ask
from dormant.runtime.slice import Deferred, Idle
from dormant.runtime.sweeper import sweep_once
from dormant.stores.base import InboxState, NewThread, OutboxRow, Priority
from dormant.stores.redis_limiter import RedisLimiter
from dormant.stores.sql.store import SQLStore
from tests.harness import Harness


@pytest.fixture
def prefix(redis_server: redis.Redis) -> Iterator[str]:
    prefix = f"dca{secrets.token_hex(5)}"
    yield prefix
    _forget(redis_server, prefix)


def _forget(client: redis.Redis, prefix: str) -> None:
    """What a FLUSHALL does to this deployment (the shared server's other keys stay)."""
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)


def _ask(slot: str, *, interactive: bool = True, ttl_s: float = 30.0, flow: str = "a") -> Ask:
    return Ask(10, slot, ttl_s, interactive, flow)


def test_workers_hammering_the_bucket_never_get_more_than_its_limit(
    redis_server: redis.Redis, prefix: str
) -> None:
    limit = RateLimit(rpm=40, concurrency=1000, reserve=0.0)
    url = REDIS_URL
    started = time.monotonic()
    admitted: list[int] = []
    threads = [
        threading.Thread(
            target=lambda w=w: admitted.append(hammer(url, prefix, f"t{w}", 30, limit))
        )
        for w in range(6)
    ]
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        processes = pool.starmap_async(
            hammer, [(url, prefix, f"p{w}", 30, limit) for w in range(2)]
        )
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        admitted += processes.get(timeout=60)
    elapsed_s = time.monotonic() - started
    # a full bucket, plus what refilled while they hammered (40 a minute), never more
    assert 40 <= sum(admitted) <= 40 + int(elapsed_s * 40 / 60) + 1
    held = redis_server.zcard(f"{prefix}:limit:b:slots")
    assert held == sum(admitted)  # each admission took a slot, none released yet


def test_a_slot_held_by_a_killed_worker_comes_back_after_its_lease(
    redis_server: redis.Redis, prefix: str
) -> None:
    limiter = RedisLimiter(redis_server, prefix)
    limit = RateLimit(concurrency=2, reserve=0.0)
    assert limiter.acquire("b", limit, _ask("dies", ttl_s=0.3)) == 0  # never released
    assert limiter.acquire("b", limit, _ask("lives")) == 0
    assert 0 < limiter.acquire("b", limit, _ask("third")) <= 1.0
    limiter.release("b", limit, "lives")
    assert limiter.acquire("b", limit, _ask("third")) == 0
    wait_until(lambda: limiter.acquire("b", limit, _ask("fourth")) == 0, 5, "the dead slot's lease")


def test_background_work_leaves_a_shared_concurrency_slot_to_user_text(
    redis_server: redis.Redis, prefix: str
) -> None:
    limiter = RedisLimiter(redis_server, prefix)
    limit = RateLimit(concurrency=4, reserve=0.05)
    background = [limiter.acquire("b", limit, _ask(f"bg{n}", interactive=False)) for n in range(4)]
    assert background.count(0.0) == 3
    assert limiter.acquire("b", limit, _ask("user")) == 0


def test_shared_background_work_leaves_the_reserve_and_pays_for_it(
    redis_server: redis.Redis, prefix: str
) -> None:
    limiter = RedisLimiter(redis_server, prefix)

    def admitted(bucket: str, limit: RateLimit, asks: list[Ask]) -> tuple[int, int]:
        """How many were admitted, and the most the bucket may have refilled meanwhile."""
        started_s = time.monotonic()
        count = [limiter.acquire(bucket, limit, ask) for ask in asks].count(0.0)
        refilled = (time.monotonic() - started_s) * (limit.rpm or 0) / 60
        return count, math.ceil(refilled)

    limit = RateLimit(rpm=100, reserve=0.05, burst_s=60)
    asks = [_ask(f"bg{n}", interactive=False, flow=f"f{n}") for n in range(100)]
    count, slack = admitted("b", limit, asks)
    assert 95 <= count <= 95 + slack  # 5 (a twentieth) left for user text
    count, slack = admitted("b", limit, [_ask(f"user{n}") for n in range(6)])
    assert 5 <= count <= 5 + slack
    paced = RateLimit(rpm=600, reserve=0.05)  # by default 1 s' worth at 570 a minute: 9.5
    asks = [_ask(f"p{n}", interactive=False, flow=f"f{n}") for n in range(60)]
    count, slack = admitted("p", paced, asks)
    assert 9 <= count <= 9 + slack


def test_the_provider_drains_the_shared_bucket_and_usage_corrects_it(
    redis_server: redis.Redis, prefix: str
) -> None:
    limiter = RedisLimiter(redis_server, prefix)
    other_worker = RedisLimiter(redis_server, prefix)
    limit = RateLimit(rpm=100, tpm=10_000, reserve=0.0)
    assert limiter.acquire("b", limit, Ask(9000, "big", 30, True)) == 0
    assert 0 < other_worker.acquire("b", limit, Ask(5000, "next", 30, True)) <= 30
    limiter.release("b", limit, "big", correction_tokens=9000 - 1000)  # it used 1000
    assert other_worker.acquire("b", limit, Ask(5000, "next", 30, True)) == 0
    limiter.feedback("b", limit, ProviderLimits(retry_after_s=12.0))
    # the provider's time, then its 10 tokens' refill (the 429 said no limit had room)
    assert 11.5 < other_worker.acquire("b", limit, _ask("after-429")) <= 12.06
    limiter.count("rate_limited")
    limiter.count("asleep_s", 2.5)
    counters = other_worker.counters()
    assert counters["admitted"] == 2 and counters["refused"] == 2
    assert counters["rate_limited"] == 1 and counters["asleep_s"] == 2.5


def test_refused_background_asks_get_places_spaced_by_the_rate(
    redis_server: redis.Redis, prefix: str
) -> None:
    limiter = RedisLimiter(redis_server, prefix)
    limit = RateLimit(rpm=60, reserve=0.0)
    for n in range(60):
        assert limiter.acquire("b", limit, _ask(f"warm{n}")) == 0
    burst = [limiter.acquire("b", limit, _ask(f"a{n}", interactive=False)) for n in range(5)]
    # one a second, in order (each answer is read a little later than the one before, and
    # the bucket refilled a little while the 60 were taken: a busy machine only shortens)
    assert 0 < burst[0] <= 1.001
    assert all(0.9 < later - earlier <= 1.001 for earlier, later in itertools.pairwise(burst))
    late = limiter.acquire("b", limit, _ask("b0", interactive=False, flow="late"))
    assert 0 < late <= 1.001 and late < burst[1]  # another agent is not queued behind
    user = limiter.acquire("b", limit, _ask("u"))
    assert 0 < user <= 1.001


def test_a_place_is_kept_and_paid_in_its_turn(redis_server: redis.Redis, prefix: str) -> None:
    limiter = RedisLimiter(redis_server, prefix)
    limit = RateLimit(rpm=600, tpm=600_000, reserve=0.01)  # background leaves 6 requests
    limiter.feedback("b", limit, ProviderLimits(retry_after_s=0.0))  # empty: a 429
    emptied_ms = float(redis_server.hget(f"{prefix}:limit:b", "blocked"))  # type: ignore[arg-type]
    asks = {h: Ask(1000, f"slot-{h}", 30, False, "a", holder=h) for h in ("h0", "h1", "h2")}
    assert all(limiter.acquire("b", limit, ask) > 0 for ask in asks.values())
    places_key = f"{prefix}:limit:b:places"

    def place_ms(holder: str) -> float:
        return float(redis_server.zscore(places_key, holder))  # type: ignore[arg-type]

    # 7,000 tokens (its 1,000 and the 1 % left to user text: the 429 said no limit had
    # room, so the tokens are empty too) at 10,000 a second, then each place one request
    # later at the pace (99 % of the rate): Redis time, so exact
    assert place_ms("h0") - emptied_ms == pytest.approx(700, abs=2)
    assert place_ms("h1") - place_ms("h0") == pytest.approx(100 / 0.99, abs=1)
    assert place_ms("h2") - place_ms("h1") == pytest.approx(100 / 0.99, abs=1)
    # asking early keeps the place: it is not sent to the back of the queue
    kept_ms = place_ms("h2")
    assert limiter.acquire("b", limit, asks["h2"]) > 0 and place_ms("h2") == kept_ms

    def redis_s() -> float:
        seconds, micros = redis_server.time()
        return float(seconds) + micros / 1e6

    wait_until(lambda: redis_s() * 1000 > kept_ms + 100, 5, "every place due")
    limiter.feedback("b", limit, ProviderLimits(retry_after_s=0.0))  # empty again
    # a due place the bucket cannot pay for yet is kept, and told when it can: after the
    # places ahead of it, before any newcomer (each answer is read later than the one
    # before, so a busy machine only shortens the later ones)
    h2_s = limiter.acquire("b", limit, asks["h2"])
    newcomer = Ask(1000, "slot-new", 30, False, "a", holder="new")
    newcomer_s = limiter.acquire("b", limit, newcomer)
    h0_s = limiter.acquire("b", limit, asks["h0"])
    assert 0 < h0_s < h2_s <= 0.901 < newcomer_s
    assert place_ms("h2") == kept_ms
    for holder, ask in asks.items():
        admitted = functools.partial(limiter.acquire, "b", limit, ask)
        wait_until(lambda: admitted() == 0, 5, f"{holder} in its turn")  # noqa: B023


def test_shared_user_text_refused_together_is_told_distinct_turns_before_background(
    redis_server: redis.Redis, prefix: str
) -> None:
    """Issue 35: user text refused together after a 429 was told the same wait, came back
    together, and all but one were refused again. Each now gets its own turn, a request
    apart after the provider's Retry-After (when the refused request passes), is admitted
    there, and background work waits for every user text waiting its turn."""
    limiter = RedisLimiter(redis_server, prefix)
    limit = RateLimit(rpm=600)  # a request each 0.1 s
    said = ProviderLimits(retry_after_s=0.3, requests_remaining=0, tokens_remaining=600)
    limiter.feedback("b", limit, said)
    users = [Ask(10, f"s{n}", 30, True, "a", holder=f"user{n}") for n in range(4)]
    turns = [limiter.acquire("b", limit, ask) for ask in users]
    # each read a little later than the one before: a busy machine only shortens them
    assert all(0.2 < turn_s <= 0.301 + 0.1 * n for n, turn_s in enumerate(turns))
    told = redis_server.zrange(f"{prefix}:limit:b:turns", 0, -1, withscores=True)
    assert [holder for holder, _ in told] == [f"user{n}" for n in range(4)]
    turn_ms = [at_ms for _, at_ms in told]
    assert all(b - a == pytest.approx(100) for a, b in itertools.pairwise(turn_ms))
    background = Ask(10, "bg", 30, False, "f", holder="bg")
    assert limiter.acquire("b", limit, background) > turns[-1]
    for n, ask in enumerate(users):
        admitted = functools.partial(limiter.acquire, "b", limit, ask)
        wait_until(lambda: admitted() == 0, 5, f"user{n} in its turn")  # noqa: B023
    assert redis_server.zcard(f"{prefix}:limit:b:turns") == 0


def test_a_due_holder_refused_by_the_pace_is_told_its_turn_after_those_ahead(
    redis_server: redis.Redis, prefix: str
) -> None:
    """Issue 35: with places due and unclaimed ahead of it, a holder the pace refuses is
    told when the pace will have paid for them too, not for itself alone (it used to come
    back every time the pace refilled by one call, with every other due holder)."""
    limiter = RedisLimiter(redis_server, prefix)
    limit = RateLimit(rpm=600, reserve=0.0, burst_s=0.1)  # the pace holds one call
    assert limit.paced_requests == pytest.approx(1.0)
    assert limiter.acquire("b", limit, Ask(10, "first", 30, False, "a")) == 0  # pace spent
    asks = {h: Ask(10, f"slot-{h}", 30, False, "a", holder=h) for h in ("h0", "h1", "h2", "h3")}
    assert all(limiter.acquire("b", limit, ask) > 0 for ask in asks.values())
    last_ms = float(redis_server.zscore(f"{prefix}:limit:b:places", "h3"))  # type: ignore[arg-type]

    def redis_ms() -> float:
        seconds, micros = redis_server.time()
        return float(seconds) * 1000 + micros / 1000

    wait_until(lambda: redis_ms() > last_ms + 50, 5, "every place due")
    assert limiter.acquire("b", limit, asks["h3"]) == 0  # a full pace: the first to ask
    # h2 has h0 and h1 ahead of it: its turn is three calls of the pace away (0.1 s each)
    assert 0.25 < limiter.acquire("b", limit, asks["h2"]) <= 0.301


def test_a_holder_claiming_its_place_does_not_count_itself_ahead(
    redis_server: redis.Redis, prefix: str
) -> None:
    """Issue 35: a place's time was compared at a millisecond's precision, so a holder whose
    place rounded up counted itself among the places ahead of it (about half of them) and
    was told to come back a call later: a second slice task for nothing."""
    limiter = RedisLimiter(redis_server, prefix)
    limit = RateLimit(rpm=600, reserve=0.0, burst_s=0.15)  # the pace holds 1.5 calls
    assert limiter.acquire("b", limit, Ask(10, "first", 30, False, "a")) == 0  # 0.5 left
    seconds, micros = redis_server.time()
    due_ms = seconds * 1000 + micros // 1000 - 20 + 0.0007  # due, rounds up at 3 places
    redis_server.zadd(f"{prefix}:limit:b:places", {"h": due_ms})
    # half a call owed, nothing ahead of it: 50 ms (a call ahead would be 150 ms)
    assert limiter.acquire("b", limit, Ask(10, "slot-h", 30, False, "a", holder="h")) <= 0.051


def test_a_launch_parks_in_its_lines_queue_and_the_admitted_ask_wakes_it(
    redis_server: redis.Redis, prefix: str
) -> None:
    limiter = RedisLimiter(redis_server, prefix)
    client_side = RedisLimiter(redis_server, prefix)  # a client's: it knows no limits
    limit = RateLimit(rpm=600, reserve=0.0, burst_s=0.1)  # the pace holds one call
    assert client_side.place("a/a", "early") is None  # no line has queued: run it now

    def ask(holder: str) -> float:
        return limiter.acquire(
            "b", limit, Ask(10, holder, 30, False, "a", holder=holder, line="a/a")
        )

    assert ask("t0") == 0
    assert 0 < ask("t1") <= 0.101  # refused: the line "a/a" now queues in "b"
    assert client_side.place("other/a", "x") is None
    parked = [client_side.place("a/a", f"p{n}") for n in range(3)]
    assert all(p is not None for p in parked)
    places = redis_server.zrange(f"{prefix}:limit:b:parked", 0, -1, withscores=True)
    assert [holder for holder, _ in places] == ["p0", "p1", "p2"]  # a call apart, in order
    assert [round(b[1] - a[1]) for a, b in itertools.pairwise(places)] == [100, 100]
    assert client_side.place("a/a", "p1") == pytest.approx(parked[1], abs=0.02)  # kept
    assert limiter.counters()["parked"] == 3
    wait_until(lambda: ask("t1") == 0, 5, "t1 in its turn")
    woken = limiter.next_due("b", limit, 60.0)  # every turn within 2 s: all three
    assert [holder for holder, _ in woken] == ["p0", "p1", "p2"]
    assert all(0 <= wait_s <= 0.35 for _, wait_s in woken)
    assert limiter.next_due("b", limit, 60.0) == []  # woken once
    # a woken holder claims its place in its turn
    wait_until(lambda: ask("p0") == 0, 5, "p0 in its turn")


def test_a_full_set_of_concurrency_slots_wakes_no_parked_thread(
    redis_server: redis.Redis, prefix: str
) -> None:
    limiter = RedisLimiter(redis_server, prefix)
    limit = RateLimit(rpm=600, concurrency=3, reserve=0.05, burst_s=0.1)  # 2 slots for us

    def ask(holder: str) -> float:
        return limiter.acquire("b", limit, Ask(10, holder, 30, False, "a", holder=holder, line="l"))

    assert ask("t0") == 0
    assert ask("t1") > 0  # the line queues
    assert limiter.place("l", "p0") is not None and limiter.place("l", "p1") is not None
    wait_until(lambda: ask("t1") == 0, 5, "t1 in its turn")  # both slots taken
    assert limiter.next_due("b", limit, 60.0) == []
    limiter.release("b", limit, "t0")  # a slot given back wakes the next
    assert [holder for holder, _ in limiter.next_due("b", limit, 60.0)] == ["p0"]


def test_a_redis_flush_resets_the_limits_and_loses_no_deferred_thread(
    redis_server: redis.Redis, prefix: str, celery_database_url: str
) -> None:
    model = ScriptedModel(lambda items: reply("done"))
    store = SQLStore(celery_database_url)
    h = Harness(Agent("a", model=model), store=store)
    limiter = RedisLimiter(redis_server, prefix)
    settings = replace(h.deps.settings, rate_limits=(("scripted", RateLimit(rpm=1)),))
    h.deps = replace(h.deps, settings=settings, limiter=limiter)
    ids = [f"thr_{prefix}_{n}" for n in range(2)]
    for thread_id in ids:
        message = (f"launch:{thread_id}", UserMessage(text="go"), Priority.BACKGROUND)
        store.create_thread(NewThread(id=thread_id, agent="a", messages=[message]))
    try:
        assert isinstance(h.step(ids[0]), Idle)
        deferred = h.step(ids[1])
        assert isinstance(deferred, Deferred) and deferred.wait_s > 50
        _forget(redis_server, prefix)  # Redis flushed: the bucket is full again
        woken: list[str] = []

        class Recording:
            def wake(self, thread_id: str, priority: int) -> bool:
                woken.append(thread_id)
                return True

            def dispatch(self, row: OutboxRow) -> None:
                raise AssertionError("nothing to dispatch")

        later = datetime.now(UTC) + timedelta(seconds=deferred.wait_s + 1)
        sweep_once(store, h.lease, Recording(), later, 0.0, 0.0)
        assert ids[1] in woken  # SQL kept its messages and its time
        assert isinstance(h.step(ids[1]), Idle)
        assert [row.state for row in store.inbox(ids[1])] == [InboxState.DONE]
    finally:
        store.close()


def test_the_next_shared_parked_thread_is_left_parked_while_one_awake_ahead_will_wake_it(
    redis_server: redis.Redis, prefix: str
) -> None:
    """Issue 35: each admitted call woke the next parked thread however far its turn, so
    the whole queue was woken ahead and a 429 put each one behind its turn. Past the
    window, the next is woken only when no holder awake ahead of it will ask first."""
    limiter = RedisLimiter(redis_server, prefix)
    limit = RateLimit(rpm=20, reserve=0.0)  # a call each 3 s: every turn past the window

    def ask(holder: str) -> float:
        return limiter.acquire("b", limit, Ask(10, holder, 30, False, "a", holder=holder, line="l"))

    assert ask("t0") == 0
    assert 2.9 < ask("t1") <= 3.0  # refused: awake, at its place
    assert limiter.place("l", "p0") is not None
    assert limiter.next_due("b", limit, 60.0) == []  # t1 will ask first, and wake p0
    redis_server.zrem(f"{prefix}:limit:b:places", "t1")  # nobody awake ahead: p0 is next
    assert [holder for holder, _ in limiter.next_due("b", limit, 60.0)] == ["p0"]
