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
    TURN_KEPT_S,
    USAGE_WEIGHT,
    WAKE_AHEAD_S,
    Ask,
)

__all__ = ["RedisLimiter"]

log = logging.getLogger("dormant.admission")

# KEYS[1] the bucket's hash, KEYS[2] its slots, KEYS[3] its flows' tails, KEYS[4] the
# counters, KEYS[5] its holders' places, KEYS[6] the places parked, KEYS[7] a line's record
# (or the bucket's hash again: unused), KEYS[8] user text's turns; ARGV[1..6] rpm, tpm,
# concurrency (0: unlimited), the reserve share, and the most requests and tokens the
# background pace holds (``RateLimit.paced_requests``/``paced_tokens``: one formula, in
# Python). The pace (``pr``, ``pt``) refills at ``1 - reserve`` of each rate; ``utail`` is
# when the last turn given to user text ends.
_REFILL = (
    f"local turn_kept = {round(TURN_KEPT_S * 1000)}\n"
    + """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local conc, reserve = tonumber(ARGV[3]), tonumber(ARGV[4])
local prcap, ptcap = tonumber(ARGV[5]), tonumber(ARGV[6])
local state = redis.call('HMGET', KEYS[1], 'r', 't', 'at', 'blocked', 'used', 'pr', 'pt', 'ut')
local r = tonumber(state[1]) or rpm
local tk = tonumber(state[2]) or tpm
local at = tonumber(state[3]) or now
local blocked = tonumber(state[4]) or 0
local used = tonumber(state[5]) or 0
local pr = tonumber(state[6]) or prcap
local pt = tonumber(state[7]) or ptcap
local utail = tonumber(state[8]) or 0
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
    'pt', tostring(pt), 'ut', tostring(utail))
  redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(120000, blocked - now + 60000)))
end
local function forget(kept)  -- places (and user text's turns) not claimed in time
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - kept)
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now - kept)
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now - turn_kept)
end
-- the wait (ms) before every limit admits an ask of `tokens` (`spaced` as places and the
-- pace count them) after the `ahead` places due before it
local function wait_for(tokens, spaced, interactive, ahead, poll)
  local share = reserve
  if interactive then share = 0 end
  local wait = math.max(0, blocked - now)
  -- after a 429 the levels refill only from the provider's time: every ask is told that too
  local refill = math.max(0, at - now)
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
  return wait
end
-- the time (ms) the bucket takes to afford one more call at the full rate
local function spacing_of(spaced, conc_spacing)
  local spacing = 0
  if rpm > 0 then spacing = 60000 / rpm end
  if tpm > 0 then spacing = math.max(spacing, spaced * 60000 / tpm) end
  if spacing == 0 and conc > 0 then spacing = conc_spacing / conc end
  return spacing
end
-- a place in the flow's queue: after its last place, spaced by the rate times the flows
-- waiting over its weight; returns its start
local function enqueue(flow, weight, spaced, wait, conc_spacing)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local tail = redis.call('ZSCORE', KEYS[3], flow)
  local waiting = redis.call('ZCARD', KEYS[3])
  if tail then tail = tonumber(tail) else tail = 0; waiting = waiting + 1 end
  -- background is paced at 1 - reserve of the rate
  local spacing = spacing_of(spaced, conc_spacing) / (1 - reserve)
  local start = math.max(now + wait, tail)
  local finish = start + spacing * waiting / weight
  redis.call('ZADD', KEYS[3], finish, flow)
  redis.call('PEXPIRE', KEYS[3], math.ceil(finish - now + 60000))
  return start
end
local function hold(key, holder, start, kept)  -- a place kept in a sorted set
  redis.call('ZADD', key, start, holder)
  local ttl = math.ceil(start - now + kept + 60000)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end
"""
)

# ARGV[7..] the estimated tokens, the slot id, its ttl in ms, 1 if interactive, the flow,
# its weight, the slot poll and the concurrency spacing in ms, the holder, how early it may
# claim its place and how long a place is kept (ms), the line ('' for none) and the bucket's
# name. Returns 0 when admitted, else the wait in ms (at least 1).
_ACQUIRE = (
    _REFILL
    + """
local tokens, slot, ttl = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
local interactive, flow, weight = ARGV[10] == '1', ARGV[11], tonumber(ARGV[12])
local poll, conc_spacing = tonumber(ARGV[13]), tonumber(ARGV[14])
local holder, early, kept = ARGV[15], tonumber(ARGV[16]), tonumber(ARGV[17])
local line, bucket = ARGV[18], ARGV[19]
forget(kept)
local place = nil
local background = holder ~= '' and not interactive
local user = holder ~= '' and interactive
if background then
  place = tonumber(redis.call('ZSCORE', KEYS[5], holder))
  redis.call('ZREM', KEYS[6], holder)  -- it asks: whoever runs it wakes it from now on
elseif user then  -- user text's turn
  place = tonumber(redis.call('ZSCORE', KEYS[8], holder))
end
if place and place - now > early then  -- early: it keeps its place
  redis.call('HINCRBY', KEYS[4], 'refused', 1)
  return math.max(1, math.ceil(place - now))
end
local spaced = tokens
if used > 0 then spaced = math.min(tokens, used) end
-- the places due before this ask (before its own place, or by now): it pays after them;
-- user text after the user text told a turn before it, background after every one waiting
local before = now + early
if place then before = place end
local until_before = '(' .. string.format('%.17g', before)
local ahead = redis.call('ZCARD', KEYS[8])
if interactive and place then ahead = redis.call('ZCOUNT', KEYS[8], '-inf', until_before)
elseif not interactive then ahead = ahead + redis.call('ZCOUNT', KEYS[5], '-inf', until_before)
end
local wait = wait_for(tokens, spaced, interactive, ahead, poll)
if wait < 1 then  -- under a millisecond: admitted (the answer is in whole ms)
  if rpm > 0 then r = r - 1 end
  if tpm > 0 then tk = tk - tokens end
  if not interactive then pr, pt = pr - 1, pt - spaced end
  if conc > 0 then
    redis.call('ZADD', KEYS[2], now + ttl, slot)
    redis.call('PEXPIRE', KEYS[2], math.ceil(ttl + 60000))
  end
  if holder ~= '' then  -- its place, or its turn, is taken
    for _, key in ipairs({KEYS[5], KEYS[6], KEYS[8]}) do redis.call('ZREM', key, holder) end
  end
  save()
  redis.call('HINCRBY', KEYS[4], 'admitted', 1)
  return 0
end
if not place and not interactive then
  local start = enqueue(flow, weight, spaced, wait, conc_spacing)
  wait = start - now
  if holder ~= '' then hold(KEYS[5], holder, start, kept) end
elseif not place and user then  -- its turn: after the user text refused before it
  local start = math.max(now + wait, utail)
  utail = start + spacing_of(spaced, conc_spacing)
  hold(KEYS[8], holder, start, turn_kept)
  wait = start - now
end
if background and line ~= '' then  -- where launches of its line now queue (Limiter.place)
  redis.call('HSET', KEYS[7], 'bucket', bucket, 'rpm', ARGV[1], 'tpm', ARGV[2],
    'conc', ARGV[3], 'reserve', ARGV[4], 'prcap', ARGV[5], 'ptcap', ARGV[6],
    'tokens', ARGV[7], 'flow', flow, 'weight', ARGV[12])
  redis.call('PEXPIRE', KEYS[7], math.ceil(math.max(0, wait) + kept))
end
save()
redis.call('HINCRBY', KEYS[4], 'refused', 1)
return math.max(1, math.ceil(wait))
"""
)

# ARGV[7..] the line's tokens, flow and weight, the holder, the slot poll, the concurrency
# spacing, how early a place may be claimed and how long it is kept (ms). Returns 0 when
# the holder should run now (nothing taken), else the wait until its place (at least 1 ms).
_PLACE = (
    _REFILL
    + """
local tokens, flow, weight = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
local holder, poll, conc_spacing = ARGV[10], tonumber(ARGV[11]), tonumber(ARGV[12])
local early, kept = tonumber(ARGV[13]), tonumber(ARGV[14])
forget(kept)
local held = tonumber(redis.call('ZSCORE', KEYS[5], holder))
if held then return math.max(1, math.ceil(held - now)) end  -- a launch retried keeps it
-- no one ahead will be admitted and wake it: it runs now
if redis.call('ZCARD', KEYS[5]) <= redis.call('ZCARD', KEYS[6]) then return 0 end
local spaced = tokens
if used > 0 then spaced = math.min(tokens, used) end
local ahead = redis.call('ZCOUNT', KEYS[5], '-inf', '(' .. string.format('%.17g', now + early))
ahead = ahead + redis.call('ZCARD', KEYS[8])  -- user text waiting its turn goes first
local wait = wait_for(tokens, spaced, false, ahead, poll)
local tail = tonumber(redis.call('ZSCORE', KEYS[3], flow))
if wait < 1 and (not tail or tail <= now) then return 0 end  -- no queue: admitted now
local start = math.max(now + 1, enqueue(flow, weight, spaced, wait, conc_spacing))
hold(KEYS[5], holder, start, kept)
hold(KEYS[6], holder, start, kept)
local ttl = math.ceil(start - now + kept)
if redis.call('PTTL', KEYS[7]) < ttl then redis.call('PEXPIRE', KEYS[7], ttl) end
save()
redis.call('HINCRBY', KEYS[4], 'parked', 1)
return math.max(1, math.ceil(start - now))
"""
)

# ARGV[7..] the longest wait to wake (ms), how far ahead to wake (ms), how long after its
# place a holder not parked is awake (ms), how long a place is kept (ms), the most to wake.
# Returns holder, wait (ms), holder, ...
_NEXT_DUE = (
    _REFILL
    + """
local longest, ahead_ms, grace = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local kept, most = tonumber(ARGV[10]), tonumber(ARGV[11])
forget(kept)
if conc > 0 then  -- no more than the free slots: a release wakes the rest
  local spare = 0
  if reserve > 0 then spare = math.min(conc - 1, math.max(1, math.floor(conc * reserve))) end
  most = math.min(most, conc - spare - redis.call('ZCARD', KEYS[2]))
  if most <= 0 then return {} end
end
local parked = redis.call('ZRANGE', KEYS[6], 0, most - 1, 'WITHSCORES')
local due = {}
for i = 1, #parked, 2 do
  local holder, place = parked[i], tonumber(parked[i + 1])
  local ahead = redis.call('ZCOUNT', KEYS[5], '-inf', '(' .. string.format('%.17g', place))
  ahead = ahead + redis.call('ZCARD', KEYS[8])  -- user text waiting its turn goes first
  -- a turn's tokens: what calls have been using (unknown before the first answer)
  local wait = math.max(0, place - now, wait_for(used, used, false, ahead, 0))
  -- past the window, the first is woken only if no holder awake ahead will ask first
  local since, upto = string.format('(%.17g', now - grace), string.format('(%.17g', place)
  local awake = redis.call('ZCOUNT', KEYS[5], since, upto)
  awake = awake > redis.call('ZCOUNT', KEYS[6], since, upto)
  if wait > longest or (wait > ahead_ms and (#due > 0 or awake)) then break end
  redis.call('ZREM', KEYS[6], holder)
  due[#due + 1], due[#due + 2] = holder, tostring(math.ceil(wait))
end
return due
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

# KEYS[1] a bucket's slots; ARGV[1] the slot id, ARGV[2] its new ttl (ms). Redis's clock, as
# the slots' scores are.
_RENEW_SLOT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local expires = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if expires == nil or expires <= now then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""

# ARGV[7..11] retry-after, requests remaining, their reset, tokens remaining, their reset
# (ms for times; '' when the provider did not say).
_FEEDBACK = (
    _REFILL
    + """
local function arg(i) if ARGV[i] ~= '' then return tonumber(ARGV[i]) end end
local retry, rrem, trem = arg(7), arg(8), arg(10)
if retry then
  -- at its Retry-After the refused request passes: one request then; a limit the provider
  -- said has room was not what refused it; the pace is emptied (background waits)
  blocked = math.max(blocked, now + retry)
  if rpm > 0 and (not rrem or rrem < 1) then r = math.min(rpm, 1) end
  if tpm > 0 and (not trem or trem < 1) then tk = math.min(tk, 0) end
  pr, pt = math.min(pr, 0), math.min(pt, 0)
  at = math.max(at, blocked)
else
  -- "remaining" caps the bucket; its reset (the limit full again) is no wait: see
  -- MemoryLimiter.feedback
  if rrem and rpm > 0 then r = math.min(r, rrem) end
  if trem and tpm > 0 then tk = math.min(tk, trem) end
end
save()
return 1
"""
)


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
        self._acquire = client.register_script(_ACQUIRE)
        self._place = client.register_script(_PLACE)
        self._next_due = client.register_script(_NEXT_DUE)
        self._release = client.register_script(_RELEASE)
        self._renew_slot = client.register_script(_RENEW_SLOT)
        self._feedback = client.register_script(_FEEDBACK)
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
