"""``RedisLimiter``: the ``Limiter`` every worker shares, one atomic Lua script per step.

Each bucket is three keys under the deployment's prefix: ``{prefix}:limit:{bucket}`` (a
hash: request and token levels, when they were last refilled, until when the provider
said to stop), ``...:slots`` (a sorted set of concurrency slots scored by their lease's
expiry: a worker that dies holding one gives it back when the score passes) and
``...:tails`` (each flow's queue end, see ``runtime/limiter.py``) and ``...:places`` (each
holder's reserved place, scored by its time). Time is Redis's own
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
    CONCURRENCY_SPACING_S,
    COUNTERS,
    PLACE_EARLY_S,
    PLACE_KEPT_S,
    SLOT_POLL_S,
    USAGE_WEIGHT,
    Ask,
)

__all__ = ["RedisLimiter"]

log = logging.getLogger("dormant.admission")

# KEYS[1] the bucket's hash, KEYS[2] its slots, KEYS[3] its flows' tails, KEYS[4] the
# counters, KEYS[5] its holders' places; ARGV[1..6] rpm, tpm, concurrency (0: unlimited),
# the reserve share, and the most requests and tokens the background pace holds
# (``RateLimit.paced_requests``/``paced_tokens``: one formula, in Python). The pace
# (``pr``, ``pt``) refills at ``1 - reserve`` of each rate.
_REFILL = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local conc, reserve = tonumber(ARGV[3]), tonumber(ARGV[4])
local prcap, ptcap = tonumber(ARGV[5]), tonumber(ARGV[6])
local state = redis.call('HMGET', KEYS[1], 'r', 't', 'at', 'blocked', 'used', 'pr', 'pt')
local r = tonumber(state[1]) or rpm
local tk = tonumber(state[2]) or tpm
local at = tonumber(state[3]) or now
local blocked = tonumber(state[4]) or 0
local used = tonumber(state[5]) or 0
local pr = tonumber(state[6]) or prcap
local pt = tonumber(state[7]) or ptcap
if now > at then
  local paced = (now - at) * (1 - reserve)
  if rpm > 0 then
    r = math.min(rpm, r + (now - at) * rpm / 60000)
    pr = math.min(prcap, pr + paced * rpm / 60000)
  end
  if tpm > 0 then
    tk = math.min(tpm, tk + (now - at) * tpm / 60000)
    pt = math.min(ptcap, pt + paced * tpm / 60000)
  end
  at = now
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local function save()
  redis.call('HSET', KEYS[1], 'r', tostring(r), 't', tostring(tk), 'at', tostring(at),
    'blocked', tostring(blocked), 'used', tostring(used), 'pr', tostring(pr),
    'pt', tostring(pt))
  redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(120000, blocked - now + 60000)))
end
"""

# ARGV[7..] the estimated tokens, the slot id, its ttl in ms, 1 if interactive, the flow,
# its weight, the slot poll and the concurrency spacing in ms, the holder, how early it may
# claim its place and how long a place is kept (ms). Returns 0 when admitted, else the wait
# in ms (at least 1).
_ACQUIRE = (
    _REFILL
    + """
local tokens, slot, ttl = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
local interactive, flow, weight = ARGV[10] == '1', ARGV[11], tonumber(ARGV[12])
local poll, conc_spacing = tonumber(ARGV[13]), tonumber(ARGV[14])
local holder, early, kept = ARGV[15], tonumber(ARGV[16]), tonumber(ARGV[17])
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - kept)
local place = nil
if holder ~= '' and not interactive then place = tonumber(redis.call('ZSCORE', KEYS[5], holder)) end
if place and place - now > early then  -- early: it keeps its place
  redis.call('HINCRBY', KEYS[4], 'refused', 1)
  return math.max(1, math.ceil(place - now))
end
local share = reserve
if interactive then share = 0 end
local spaced = tokens
if used > 0 then spaced = math.min(tokens, used) end
-- the places due before this ask (before its own place, or by now): it pays after them
local ahead = 0
if not interactive then
  local before = now + early
  if place then before = place end
  ahead = redis.call('ZCOUNT', KEYS[5], '-inf', '(' .. string.format('%.3f', before))
end
local wait = math.max(0, blocked - now)
-- after a 429 the levels refill only from the provider's time: background is told that too
local refill = 0
if not interactive then refill = math.max(0, at - now) end
local paced = math.min(spaced, ptcap)  -- a call's tokens as the pace counts them
if rpm > 0 then
  local need = math.min(rpm, 1 + math.ceil(rpm * share) + ahead)
  if r < need then wait = math.max(wait, refill + (need - r) * 60000 / rpm) end
  if not interactive and pr < 1 then  -- its turn: after the places ahead of it too
    wait = math.max(wait, refill + (1 + ahead - pr) * 60000 / (rpm * (1 - reserve)))
  end
end
if tpm > 0 then
  local need = math.min(tpm, tokens + tpm * share + ahead * spaced)
  if tk < need then wait = math.max(wait, refill + (need - tk) * 60000 / tpm) end
  if not interactive and pt < paced then
    local owed = paced + ahead * paced - pt
    wait = math.max(wait, refill + owed * 60000 / (tpm * (1 - reserve)))
  end
end
if conc > 0 then
  local spare = 0
  if share > 0 then spare = math.min(conc - 1, math.max(1, math.floor(conc * share))) end
  if redis.call('ZCARD', KEYS[2]) >= conc - spare then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    wait = math.max(wait, math.min(poll, tonumber(first[2]) - now))
  end
end
if wait < 1 then  -- under a millisecond: admitted (the answer is in whole ms)
  if rpm > 0 then r = r - 1 end
  if tpm > 0 then tk = tk - tokens end
  if not interactive then pr, pt = pr - 1, pt - spaced end
  if conc > 0 then
    redis.call('ZADD', KEYS[2], now + ttl, slot)
    redis.call('PEXPIRE', KEYS[2], math.ceil(ttl + 60000))
  end
  if holder ~= '' then redis.call('ZREM', KEYS[5], holder) end
  save()
  redis.call('HINCRBY', KEYS[4], 'admitted', 1)
  return 0
end
if not place and not interactive then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local tail = redis.call('ZSCORE', KEYS[3], flow)
  local waiting = redis.call('ZCARD', KEYS[3])
  if tail then tail = tonumber(tail) else tail = 0; waiting = waiting + 1 end
  local spacing = 0
  if rpm > 0 then spacing = 60000 / rpm end
  if tpm > 0 then spacing = math.max(spacing, spaced * 60000 / tpm) end
  if spacing == 0 and conc > 0 then spacing = conc_spacing / conc end
  spacing = spacing / (1 - reserve)  -- background is paced at 1 - reserve of the rate
  local start = math.max(now + wait, tail)
  local finish = start + spacing * waiting / weight
  redis.call('ZADD', KEYS[3], finish, flow)
  redis.call('PEXPIRE', KEYS[3], math.ceil(finish - now + 60000))
  wait = start - now
  if holder ~= '' then  -- not interactive, here
    redis.call('ZADD', KEYS[5], start, holder)
    local ttl = math.ceil(wait + kept + 60000)
    if redis.call('PTTL', KEYS[5]) < ttl then redis.call('PEXPIRE', KEYS[5], ttl) end
  end
end
save()
redis.call('HINCRBY', KEYS[4], 'refused', 1)
return math.max(1, math.ceil(wait))
"""
)

# ARGV[7] the slot id, ARGV[8] tokens to give back (negative: take more), ARGV[9] the
# tokens the call used (0: unknown), ARGV[10] how much they move the running mean.
_RELEASE = (
    _REFILL
    + """
redis.call('ZREM', KEYS[2], ARGV[7])
if tpm > 0 then tk = math.min(tpm, tk + tonumber(ARGV[8])) end
local spent = tonumber(ARGV[9])
if spent > 0 then
  if used <= 0 then used = spent end
  used = used + tonumber(ARGV[10]) * (spent - used)
end
save()
return 1
"""
)

# ARGV[7..11] retry-after, requests remaining, their reset, tokens remaining, their reset
# (ms for times; '' when the provider did not say).
_FEEDBACK = (
    _REFILL
    + """
local function arg(i)
  if ARGV[i] == '' then return nil end
  return tonumber(ARGV[i])
end
local retry = arg(7)
if retry then
  blocked = math.max(blocked, now + retry)
  if rpm > 0 then r, pr = math.min(r, 0), math.min(pr, 0) end
  if tpm > 0 then tk, pt = math.min(tk, 0), math.min(pt, 0) end
  at = math.max(at, blocked)
end
-- "remaining" caps the bucket; its reset (the limit full again) is no wait: see
-- MemoryLimiter.feedback
local rrem, trem = arg(8), arg(10)
if rrem and rpm > 0 then r = math.min(r, rrem) end
if trem and tpm > 0 then tk = math.min(tk, trem) end
save()
return 1
"""
)


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
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)
        self._feedback = client.register_script(_FEEDBACK)
        self.counters_key = f"{prefix}:admission"

    def keys(self, bucket: str) -> list[str]:
        base = f"{self._prefix}:limit:{bucket}"
        return [base, f"{base}:slots", f"{base}:tails", self.counters_key, f"{base}:places"]

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
        ]
        try:
            wait_ms = cast(int, self._acquire(keys=self.keys(bucket), args=args))
        except redis.RedisError:
            log.warning("admission for %s failed in Redis; admitted", bucket, exc_info=True)
            return 0.0
        return wait_ms / 1000

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
        raw = cast(dict[str, str], self._client.hgetall(self.counters_key))
        found = dict.fromkeys(COUNTERS, 0.0)
        found.update({name: float(value) for name, value in raw.items()})
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
