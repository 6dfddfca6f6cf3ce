"""What each hammering worker of ``test_celery_admission_bucket.py`` runs, in a module of
its own: the test's spawned processes import it by name, and the test module itself does
not import in them (its ``from conftest import ...`` finds the other ``conftest`` first
on a spawned child's path)."""

from __future__ import annotations

import redis

from dormant.models import RateLimit
from dormant.runtime.limiter import Ask
from dormant.stores.redis_limiter import RedisLimiter


def hammer(url: str, prefix: str, worker: str, asks: int, limit: RateLimit) -> int:
    """One worker's admissions out of ``asks`` tries (run in threads and processes); no
    slot lapses meanwhile (600 s leases)."""
    limiter = RedisLimiter(redis.Redis.from_url(url, decode_responses=True), prefix)
    asked = (Ask(10, f"{worker}-{n}", 600, True, "a") for n in range(asks))
    return sum(limiter.acquire("b", limit, ask) == 0 for ask in asked)
