"""What a small ``rpm`` admits over time, the same on the shared Redis bucket and the
in-process one: ten callers at once against ``rpm=6``, each coming back when it is told.

Redis's scripts read Redis's own clock (``TIME``), so the Redis bucket is moved in time by
moving every time it stored back by the step (its levels' ``at``, its block, user text's
turns' tail and the sorted sets' scores): a run of a minute's admissions takes
milliseconds, and real time only ever adds to the step (a caller a few ms late, never
early)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import pytest
import redis

from dormant.models import RateLimit
from dormant.runtime.limiter import Ask, Limiter
from dormant.runtime.memory_limiter import MemoryLimiter
from dormant.stores.redis_limiter import RedisLimiter

LIMIT = RateLimit(rpm=6)
"""A bucket of 6 requests refilled at 0.1 a second; background keeps a reserve of
ceil(6 * 0.05) = 1 request and is paced at 5.7 a minute in bursts of at most 1 call."""


@pytest.fixture
def prefix(redis_server: redis.Redis) -> Iterator[str]:
    prefix = f"dcr{secrets.token_hex(5)}"
    yield prefix
    keys = list(redis_server.scan_iter(match=f"{prefix}*"))
    if keys:
        redis_server.delete(*keys)


class _Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _memory() -> tuple[Limiter, Callable[[float], None]]:
    clock = _Clock()

    def to(at_s: float) -> None:
        clock.now_s = 1000.0 + at_s

    return MemoryLimiter(clock), to


def _redis(client: redis.Redis, prefix: str) -> tuple[Limiter, Callable[[float], None]]:
    limiter = RedisLimiter(client, prefix)
    base, *sets = limiter.keys("b")
    sets = [key for key in sets if key not in (base, limiter.counters_key)]

    def redis_ms() -> float:
        seconds, micros = client.time()
        return seconds * 1000 + micros / 1000

    start_ms = redis_ms()
    moved_ms = 0.0

    def to(at_s: float) -> None:  # the bucket's time made ``at_s`` after the start
        nonlocal moved_ms
        step_ms = at_s * 1000 - (redis_ms() - start_ms + moved_ms)
        if step_ms <= 0:
            return
        moved_ms += step_ms
        for name in ("at", "blocked", "ut"):
            value = client.hget(base, name)
            if value is not None and float(value) != 0:
                client.hset(base, name, repr(float(value) - step_ms))
        for key in sets:
            for member, score in client.zrange(key, 0, -1, withscores=True):
                client.zadd(key, {member: score - step_ms})

    return limiter, to


def _admitted_s(limiter: Limiter, to: Callable[[float], None], interactive: bool) -> list[float]:
    """Ten callers ask at 0 s, each refused one again when it was told, until 60 s: the
    time each was admitted."""
    asks = [Ask(10, f"s{n}", 30.0, interactive, "a", holder=f"h{n}") for n in range(10)]
    due = dict.fromkeys(range(10), 0.0)
    admitted: list[float] = []
    while due and (now_s := min(due.values())) <= 60:
        to(now_s)
        for n in sorted(n for n, at_s in due.items() if at_s == now_s):
            wait_s = limiter.acquire("b", LIMIT, asks[n])
            if wait_s == 0:
                admitted.append(now_s)
                del due[n]
            else:
                due[n] = now_s + wait_s
    return admitted


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "redis"])
def test_user_text_at_rpm_6_gets_the_full_bucket_then_a_request_each_10_s(
    redis_server: redis.Redis, prefix: str, shared: bool
) -> None:
    """A report: ten user texts against ``rpm=6`` on Redis, "10 admitted in about 25 s".
    The bucket admits six at once, then one a turn at its refill of 0.1 a second: 8 by
    25 s, the ninth at 30 s, the tenth at 40 s, on both limiters."""
    limiter, to = _redis(redis_server, prefix) if shared else _memory()
    admitted = _admitted_s(limiter, to, interactive=True)
    assert admitted == pytest.approx([0.0] * 6 + [10.0, 20.0, 30.0, 40.0], abs=0.05)
    assert sum(at_s <= 25 for at_s in admitted) == 8


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "redis"])
def test_background_at_rpm_6_gets_one_call_then_the_paced_rate(
    redis_server: redis.Redis, prefix: str, shared: bool
) -> None:
    """The same ten callers as background work: the pace holds one call (a second's worth
    of 5.7 a minute, at least one), so one goes at once and the rest a place each 60 / 5.7
    = 10.53 s apart: 3 by 25 s, 6 in the minute."""
    limiter, to = _redis(redis_server, prefix) if shared else _memory()
    admitted = _admitted_s(limiter, to, interactive=False)
    assert admitted == pytest.approx([n * 60 / 5.7 for n in range(6)], abs=0.05)
    assert sum(at_s <= 25 for at_s in admitted) == 3
