"""``RedisLimiter``: the ``Limiter`` every worker shares, one atomic Lua script per step.

Each bucket is keys under the deployment's prefix: ``{prefix}:limit:{bucket}`` (a hash:
levels, when refilled, until when the provider said to stop), ``...:slots`` (concurrency
slots scored by their lease's expiry: a worker that dies holding one gives it back when
the score passes), ``...:tails`` (each flow's queue end, see ``runtime/limiter.py``),
``...:places`` (each holder's place, scored by its time), ``...:parked`` (the places nobody
wakes yet) and ``...:turns`` (refused user text's turns). A line (an agent and flow) that
queues records where in ``{prefix}:line:{line}`` (the bucket, its limits, a call's tokens,
the flow and its weight), which a client reads to park a launch. Time is Redis's own
(``TIME``), so workers' clocks never disagree. Every key expires on its own once idle.

All of it may be lost: a flushed Redis starts every bucket full with no slot held (the
limits reset for a minute), and SQL still holds every deferred thread's messages and its
"not before" time. Counters live in the hash ``{prefix}:admission``.
"""

from __future__ import annotations

import logging
from typing import cast

import redis

from dormant.rate_limit import ProviderLimits, RateLimit
from dormant.runtime.limiter import (
    AWAKE_GRACE_S,
    CONCURRENCY_SPACING_S,
    COUNTERS,
    NEXT_DUE_MOST,
    PLACE_EARLY_S,
    PLACE_KEPT_S,
    SLOT_POLL_S,
    USAGE_WEIGHT,
    WAKE_AHEAD_S,
    Ask,
)
from dormant.stores.limiter_scripts import ACQUIRE, FEEDBACK, NEXT_DUE, PLACE, RELEASE, RENEW_SLOT

__all__ = ["RedisLimiter"]

log = logging.getLogger("dormant.admission")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else str(max(0, round(seconds * 1000)))


class RedisLimiter:
    """``Limiter`` shared by every process of a deployment through Redis.

    An unreachable Redis admits (logged): admission protects the provider's limits, and a
    429 then still defers the slice; refusing every call would stop the fleet instead.
    """

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._acquire = client.register_script(ACQUIRE)
        self._place = client.register_script(PLACE)
        self._next_due = client.register_script(NEXT_DUE)
        self._release = client.register_script(RELEASE)
        self._renew_slot = client.register_script(RENEW_SLOT)
        self._feedback = client.register_script(FEEDBACK)
        self.counters_key = f"{prefix}:admission"

    def keys(self, bucket: str, line: str = "") -> list[str]:
        base = f"{self._prefix}:limit:{bucket}"
        return [
            base,
            f"{base}:slots",
            f"{base}:tails",
            self.counters_key,
            f"{base}:places",
            f"{base}:parked",
            self.line_key(line) if line else base,
            f"{base}:turns",
        ]

    def line_key(self, line: str) -> str:
        return f"{self._prefix}:line:{line}"

    def acquire(self, bucket: str, limit: RateLimit, ask: Ask) -> float:
        args = [
            *_limits(limit),
            ask.tokens,
            ask.slot,
            _ms(ask.slot_ttl_s),
            1 if ask.interactive else 0,
            ask.flow,
            ask.weight,
            _ms(SLOT_POLL_S),
            _ms(CONCURRENCY_SPACING_S),
            ask.holder,
            _ms(PLACE_EARLY_S),
            _ms(PLACE_KEPT_S),
            ask.line if ask.holder and not ask.interactive else "",
            bucket,
        ]
        try:
            wait_ms = cast(int, self._acquire(keys=self.keys(bucket, ask.line), args=args))
        except redis.RedisError:
            log.warning("admission for %s failed in Redis; admitted", bucket, exc_info=True)
            return 0.0
        return wait_ms / 1000

    def place(self, line: str, holder: str) -> float | None:
        try:
            found = self._client.hgetall(self.line_key(line))
            if not found:
                return None
            record = {_text(k): _text(v) for k, v in found.items()}
            bucket = record["bucket"]
            limits = [record[name] for name in ("rpm", "tpm", "conc", "reserve", "prcap", "ptcap")]
            args = [
                *limits,
                record["tokens"],
                record["flow"],
                record["weight"],
                holder,
                _ms(SLOT_POLL_S),
                _ms(CONCURRENCY_SPACING_S),
                _ms(PLACE_EARLY_S),
                _ms(PLACE_KEPT_S),
            ]
            wait_ms = cast(int, self._place(keys=self.keys(bucket, line), args=args))
        except (redis.RedisError, KeyError):
            log.warning("no place for %s in line %s; run now", holder, line, exc_info=True)
            return None
        return wait_ms / 1000 if wait_ms else None

    def next_due(self, bucket: str, limit: RateLimit, longest_s: float) -> list[tuple[str, float]]:
        args = [
            *_limits(limit),
            _ms(longest_s),
            _ms(WAKE_AHEAD_S),
            _ms(AWAKE_GRACE_S),
            _ms(PLACE_KEPT_S),
            NEXT_DUE_MOST,
        ]
        try:
            found = cast(list[str | bytes], self._next_due(keys=self.keys(bucket), args=args))
        except redis.RedisError:  # the sweeper wakes them at their stored times
            log.warning("waking the next in %s failed in Redis", bucket, exc_info=True)
            return []
        pairs = zip(found[::2], found[1::2], strict=True)
        return [(_text(holder), int(_text(wait_ms)) / 1000) for holder, wait_ms in pairs]

    def release(
        self,
        bucket: str,
        limit: RateLimit,
        slot: str,
        correction_tokens: float = 0.0,
        used_tokens: float = 0.0,
    ) -> None:
        args = [*_limits(limit), slot, correction_tokens, used_tokens, USAGE_WEIGHT]
        try:
            self._release(keys=self.keys(bucket), args=args)
        except redis.RedisError:  # the slot's lease ends on its own
            log.warning("releasing a slot of %s failed in Redis", bucket, exc_info=True)

    def renew_slot(self, bucket: str, slot: str, ttl_s: float) -> bool:
        slots = self.keys(bucket)[1]
        return bool(self._renew_slot(keys=[slots], args=[slot, _ms(ttl_s)]))

    def feedback(self, bucket: str, limit: RateLimit, said: ProviderLimits) -> None:
        args = [
            *_limits(limit),
            _ms(said.retry_after_s),
            "" if said.requests_remaining is None else said.requests_remaining,
            _ms(said.requests_reset_s),
            "" if said.tokens_remaining is None else said.tokens_remaining,
            _ms(said.tokens_reset_s),
        ]
        try:
            self._feedback(keys=self.keys(bucket), args=args)
        except redis.RedisError:
            log.warning("provider feedback for %s lost in Redis", bucket, exc_info=True)

    def count(self, counter: str, amount: float = 1.0) -> None:
        try:
            self._client.hincrbyfloat(self.counters_key, counter, amount)
        except redis.RedisError:
            log.warning("admission counter %s lost in Redis", counter, exc_info=True)

    def counters(self) -> dict[str, float]:
        raw = self._client.hgetall(self.counters_key)
        found = dict.fromkeys(COUNTERS, 0.0)
        found.update({_text(name): float(value) for name, value in raw.items()})
        return found


def _limits(limit: RateLimit) -> list[float | int]:
    return [
        limit.rpm or 0,
        limit.tpm or 0,
        limit.concurrency or 0,
        limit.reserve,
        limit.paced_requests,
        limit.paced_tokens,
    ]
