"""The worker side of ``bench/burst.py``: its one agent, and the count of slot time asleep.

``dormant worker --agents burst_app`` imports this module (``bench/`` on ``PYTHONPATH``);
``BURST_PROVIDER_URL`` is the driver's rate-limited server. The agent ``burst`` answers
every message with one streamed completion from that server, through ``OpenAIModel``
exactly as a deployment would call a provider.

Importing the module also wraps the sleep of the slice's model retry
(``instrument_retry_sleep``): every second a worker slot spends asleep in backoff between
two attempts is added to a Redis counter, ``<prefix>:bench:asleep_ms``, and each such
sleep counted in ``<prefix>:bench:retry_sleeps``. The sleep is the slice's own (the retry
decides how long); only its duration is recorded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import cache
from typing import Any

import redis

from dormant import Agent
from dormant.models import OpenAIModel
from dormant.settings import Settings

MODEL = "bench-burst"


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(Settings.from_env().redis_url)


def key(prefix: str, name: str) -> str:
    return f"{prefix}:bench:{name}"


def _count(name: str, amount: int) -> None:
    _redis().incrby(key(Settings.from_env().key_prefix, name), amount)


def instrument_retry_sleep() -> bool:
    """Time every backoff sleep of ``complete_with_retry`` as the slice calls it; False
    (and nothing counted) if the slice no longer calls it that way."""
    from dormant.runtime import slice as slice_module

    real: Callable[..., Any] | None = getattr(slice_module, "complete_with_retry", None)
    if real is None:
        return False

    def timed(*args: Any, sleep: Callable[[float], None] = time.sleep, **kwargs: Any) -> Any:
        def timed_sleep(seconds: float) -> None:
            _count("retry_sleeps", 1)
            started = time.monotonic()
            try:
                sleep(seconds)
            finally:
                _count("asleep_ms", round((time.monotonic() - started) * 1000))

        return real(*args, sleep=timed_sleep, **kwargs)

    slice_module.complete_with_retry = timed  # type: ignore[attr-defined]
    return True


INSTRUMENTED = instrument_retry_sleep()
# The driver reports no slot time asleep rather than a false 0 if the wrapping failed.
_redis().set(key(Settings.from_env().key_prefix, "instrumented"), int(INSTRUMENTED))

AGENTS = [
    Agent(
        "burst",
        model=OpenAIModel(
            MODEL, base_url=os.environ.get("BURST_PROVIDER_URL", "http://127.0.0.1:9/v1")
        ),
        instructions="Summarise the event in one line.",
    )
]
