"""The Lua scripts of ``RedisLimiter`` (``redis_limiter.py``), each one atomic step: the
algorithm ``runtime/memory_limiter.py`` runs under a lock, on Redis's own clock."""

from __future__ import annotations

from dormant.runtime.limiter import TURN_KEPT_S

__all__ = ["ACQUIRE", "FEEDBACK", "NEXT_DUE", "PLACE", "RELEASE", "RENEW_SLOT"]

# KEYS[1] the bucket's hash, KEYS[2] its slots, KEYS[3] its flows' tails, KEYS[4] the
# counters, KEYS[5] its holders' places, KEYS[6] the places parked, KEYS[7] a line's record
# (or the bucket's hash again: unused), KEYS[8] user text's turns; ARGV[1..6] rpm, tpm,
# concurrency (0: unlimited), the reserve share, and the most requests and tokens the
# background pace holds (``RateLimit.paced_requests``/``paced_tokens``: one formula, in
# Python). The pace (``pr``, ``pt``) refills at ``1 - reserve`` of each rate; ``utail`` is
# when the last turn given to user text ends.
REFILL = (
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
ACQUIRE = (
    REFILL
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
PLACE = (
    REFILL
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
NEXT_DUE = (
    REFILL
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
RELEASE = (
    REFILL
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
RENEW_SLOT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local expires = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if expires == nil or expires <= now then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""

# ARGV[7..11] retry-after, requests remaining, their reset, tokens remaining, their reset
# (ms for times; '' when the provider did not say).
FEEDBACK = (
    REFILL
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
