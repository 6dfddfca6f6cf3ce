"""What Redis holds in Celery mode: the lease, the dedup fast path, wake marks, live events.

All of it may be lost (a flush, a failover): SQL stays the truth. A lost lease is fenced by
the thread's version, a lost dedup id falls back on SQL's unique key, a lost wake mark only
costs a redundant task, a lost event only a live observer. Every key starts with
``Settings.key_prefix`` so deployments and test runs sharing a Redis never collide.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any, cast

import redis

from dormant.messages import Chunk, Event, EventAdapter
from dormant.settings import Settings
from dormant.stores.redis_live import LIVE_KEEP, LIVE_LUA, live_args, live_keys

__all__ = [
    "RedisDedup",
    "RedisEvents",
    "RedisLease",
    "RedisSliceEnd",
    "RedisSweepTurns",
    "RedisWakeMarks",
    "redis_client",
    "wake_mark_ttl_s",
]

log = logging.getLogger("dormant.redis")

Redis = redis.Redis
Pipeline = redis.client.Pipeline

# KEYS[1] the lease, KEYS[2] its "refused" flag, KEYS[3] (optional) the thread's wake mark;
# ARGV[1] a fresh token, ARGV[2] the ttl in ms. Clears the wake mark in any case (the slice
# task clears it before loading the inbox: see RedisWakeMarks); a refused acquire raises the
# flag, atomically with the holder's release reading it, so no wake falls between the two.
_ACQUIRE = """
if #KEYS == 3 then
  redis.call('DEL', KEYS[3])
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('DEL', KEYS[2])
  return 1
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 0
"""
# KEYS[1] the lease, ARGV[1] the holder's token, ARGV[2] the new ttl in ms.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS[1] the wake mark, ARGV[1] the wake's priority, ARGV[2] the mark's ttl in ms.
_CLAIM = """
local queued = tonumber(redis.call('GET', KEYS[1]) or '-1')
if queued >= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
# KEYS[1] the lease, KEYS[2] its "refused" flag, ARGV[1] the holder's token: 1 if a slice
# was refused the lease meanwhile (the holder drains what that slice was woken for).
_RELEASE = """
local refused = redis.call('GET', KEYS[2])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
end
if refused then
  return 1
end
return 0
"""

# KEYS[1] the lease, KEYS[2] its "refused" flag, KEYS[3] the thread's dedup set, KEYS[4..]
# the recent-event lists; ARGV: the holder's token, the dedup ttl in ms, the number of
# applied ids and the ids, how many events to keep, their ttl in ms, the number of events
# and for each its channel, the index in KEYS of its recent list (0: not kept) and its JSON.
# Returns _RELEASE's answer.
_END_EVENTS = """
local ids = tonumber(ARGV[3])
for first = 4, 3 + ids, 500 do
  redis.call('SADD', KEYS[3], unpack(ARGV, first, math.min(first + 499, 3 + ids)))
end
if ids > 0 then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
local at = 4 + ids
local keep, kept_ttl, count = tonumber(ARGV[at]), ARGV[at + 1], tonumber(ARGV[at + 2])
local lists = tonumber(ARGV[at + 3])
at = at + 4
local watched = {}
for _ = 1, count do
  local channel, list, data = ARGV[at], tonumber(ARGV[at + 1]), ARGV[at + 2]
  at = at + 3
  if watched[channel] == nil then
    watched[channel] = redis.call('PUBLISH', channel, data) > 0
  elseif watched[channel] then
    redis.call('PUBLISH', channel, data)
  end
  if list > 0 then
    redis.call('RPUSH', KEYS[list], data)
  end
end
for list = 4, 3 + lists do
  redis.call('LTRIM', KEYS[list], -keep, -1)
  redis.call('PEXPIRE', KEYS[list], kept_ttl)
end
"""
# Then the same events for watched threads' live logs (dormant/stores/redis_live.py): ARGV
# from ``at``: the maxlen, the number of events, and for each the index in KEYS of its
# thread's watch mark (its Stream and meta follow) and live_args.
_LIVE_EVENTS = """
local maxlen, live = ARGV[at], tonumber(ARGV[at + 1])
at = at + 2
for _ = 1, live do
  local k = tonumber(ARGV[at])
  live_append(KEYS[k], KEYS[k + 1], KEYS[k + 2], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3],
    ARGV[at + 4], ARGV[at + 5], maxlen)
  at = at + 6
end
"""
_END = LIVE_LUA + _END_EVENTS + _LIVE_EVENTS + _RELEASE  # then a release: the same keys and token
_PUBLISH = LIVE_LUA + _END_EVENTS + _LIVE_EVENTS  # events alone: KEYS[1..3] unused
# The hot path, a live chunk of a long completion: KEYS the thread's live keys; ARGV its
# channel, the chunk's JSON, its attempt, the log's maxlen. One PUBLISH, one EXISTS.
_CHUNK = (
    """
redis.call('PUBLISH', ARGV[1], ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
"""
    + LIVE_LUA
    + """
live_append(KEYS[1], KEYS[2], KEYS[3], 'chunk', ARGV[2], ARGV[3], '0', '', ARGV[4])
return 1
"""
)
_UNWATCHED_S = 1.0
"""How long a chunk's answer "nobody watches this thread" is trusted within one attempt:
meanwhile its chunks are a plain ``PUBLISH``, as before streams existed. A reader that starts
watching mid-answer misses at most this much more of that answer's text."""


def redis_client(settings: Settings) -> Redis:
    """A client for ``settings.redis_url`` answering ``str`` (its pool is thread-safe), with
    timeouts so an unreachable Redis fails a call instead of hanging it."""
    return Redis.from_url(
        settings.redis_url,
        decode_responses=True,
        health_check_interval=30,
        socket_connect_timeout=5,
        socket_timeout=10,
    )


def wake_mark_ttl_s(settings: Settings) -> float:
    """How long a queued wake suppresses others: a task not started by then is presumed
    lost, and the sweeper may send another."""
    return max(settings.outbox_grace_s, 2 * settings.sweep_interval_s)


def _json(event: Event) -> str:
    return EventAdapter.dump_json(event).decode()


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisLease:
    """``Lease``: ``SET NX PX`` with a random token; renew and release only by the holder.

    Acquire, renew and release are Lua scripts: a holder whose lease expired and was taken
    by another slice can neither extend nor delete the new holder's lease, and a refused
    acquire raises a flag that the holder's release reads atomically. With ``wake_marks``
    (the worker's), acquiring also clears the thread's wake mark, in the same round trip.
    """

    def __init__(
        self, client: Redis, prefix: str, *, wake_marks: RedisWakeMarks | None = None
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._marks = wake_marks
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def _key(self, thread_id: str) -> str:
        return f"{self._prefix}:lease:{thread_id}"

    def keys(self, thread_id: str) -> list[str]:
        """The lease's key and its "refused" flag's."""
        return [self._key(thread_id), f"{self._prefix}:refused:{thread_id}"]

    def acquire(self, thread_id: str, ttl_s: float) -> str | None:
        token = secrets.token_hex(16)
        keys = self.keys(thread_id)
        if self._marks is not None:
            keys.append(self._marks.key(thread_id))
        taken = self._acquire(keys=keys, args=[token, _ms(ttl_s)])
        return token if taken else None

    def renew(self, thread_id: str, token: str, ttl_s: float) -> bool:
        return bool(self._renew(keys=[self._key(thread_id)], args=[token, _ms(ttl_s)]))

    def release(self, thread_id: str, token: str) -> bool:
        return bool(self._release(keys=self.keys(thread_id), args=[token]))

    def held(self, thread_id: str) -> bool:
        return bool(self._client.exists(self._key(thread_id)))

    def revoke(self, thread_id: str) -> None:
        self._client.delete(self._key(thread_id))


class RedisDedup:
    """``DedupSet``: one set of seen message ids per thread, expiring ``ttl_s`` after the
    last add so it stays bounded. A Redis failure reads as "not seen": SQL decides."""

    def __init__(self, client: Redis, prefix: str, ttl_s: float) -> None:
        self._client = client
        self._prefix = prefix
        self.ttl_s = ttl_s

    def key(self, thread_id: str) -> str:
        return f"{self._prefix}:dedup:{thread_id}"

    def seen(self, thread_id: str, message_id: str) -> bool:
        try:
            return bool(self._client.sismember(self.key(thread_id), message_id))
        except redis.RedisError:
            log.warning(
                "dedup lookup failed for thread %s; relying on SQL", thread_id, exc_info=True
            )
            return False

    def add(self, thread_id: str, message_ids: list[str]) -> None:
        if not message_ids:
            return
        try:
            with self._client.pipeline(transaction=False) as pipe:
                self.add_queued(pipe, thread_id, message_ids)
                pipe.execute()
        except redis.RedisError:
            log.warning("dedup add failed for thread %s; relying on SQL", thread_id, exc_info=True)

    def add_queued(self, pipe: Pipeline, thread_id: str, message_ids: list[str]) -> None:
        """Queue ``add`` on ``pipe`` (the end of a slice sends it with the lease release)."""
        if message_ids:
            key = self.key(thread_id)
            pipe.sadd(key, *message_ids)
            pipe.pexpire(key, _ms(self.ttl_s))


class RedisSweepTurns:
    """One sweep at a time across processes: beat sweeps itself (``celery/beat_sweep.py``),
    but a second beat (a rollout that overlaps, ``worker -B`` beside ``dormant beat``) or a
    ``dormant.sweep`` task from an older beat finds the turn taken and skips. The key holds
    when the running turn began (epoch ms), for an operator's ``GET``."""

    def __init__(self, client: Redis, prefix: str) -> None:
        self._client = client
        self._key = f"{prefix}:sweep"

    def take(self, spacing_s: float) -> bool:
        """Whether this sweep runs: none began in the last ``spacing_s``. With Redis
        unreachable it runs: the sweep is how work stranded by such an outage recovers."""
        try:
            began_ms = str(int(time.time() * 1000))
            return bool(self._client.set(self._key, began_ms, nx=True, px=_ms(spacing_s)))
        except redis.RedisError:
            return True


class RedisWakeMarks:
    """At most one queued slice task per thread and priority, as a hint: "a wake at least
    this urgent is already queued".

    The mark holds the highest priority queued. ``claim`` (a Lua compare-and-set) admits a
    wake only if nothing as urgent is queued: twenty tool results send one slice, but user
    text arriving behind them still sends its own to the interactive queue instead of
    waiting behind the background backlog. The slice task clears the mark before it loads
    the inbox (``RedisLease.acquire`` does, in the same call), so a message committed before
    a suppressed wake is always seen by a queued slice at least as urgent. A mark expires
    after ``ttl_s``, so a task the broker lost is re-sent by the sweeper after at most that
    long. On a Redis failure every wake is sent:
    duplicates are harmless, silence is not.
    """

    def __init__(self, client: Redis, prefix: str, ttl_s: float) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_s = ttl_s
        self._claim = client.register_script(_CLAIM)

    def key(self, thread_id: str) -> str:
        return f"{self._prefix}:queued:{thread_id}"

    @property
    def ttl_ms(self) -> int:
        return _ms(self._ttl_s)

    def server(self) -> tuple[object, ...]:
        """Where the marks live (host, port, unix socket, database): a broker on the same
        server and database can make the claim in the publish itself (``CarriedClaim``)."""
        found = self._client.connection_pool.connection_kwargs
        return tuple(found.get(name) for name in ("host", "port", "path", "db"))

    def claim(self, thread_id: str, priority: int) -> bool:
        """Whether this wake must be sent: no wake of ``priority`` or higher is queued."""
        try:
            key = self.key(thread_id)
            return bool(self._claim(keys=[key], args=[int(priority), _ms(self._ttl_s)]))
        except redis.RedisError:
            log.warning("wake mark failed for thread %s; sending anyway", thread_id, exc_info=True)
            return True

    def clear(self, thread_id: str) -> None:
        self._client.delete(self.key(thread_id))


class RedisEvents:
    """``EventSink``: every event is published as JSON on the thread's channel; events other
    than chunks are also kept in a list of the ``keep`` most recent (``LTRIM``) that expires
    ``ttl_s`` after the last one. Events are for live observers: failures are logged only."""

    def __init__(
        self, client: Redis, prefix: str, *, keep: int = 500, ttl_s: float = 24 * 3600.0
    ) -> None:
        self._client = client
        self._prefix = prefix
        self.keep = keep
        self.ttl_s = ttl_s
        self._publish = client.register_script(_PUBLISH)
        self._chunk = client.register_script(_CHUNK)
        self._unwatched: dict[str, tuple[str, float]] = {}
        """Threads a chunk found unwatched: the attempt streaming then, and until when
        (monotonic seconds) to trust it. A new attempt always asks, so a reader that came
        between two answers gets the whole of the next."""

    def channel(self, thread_id: str) -> str:
        return f"{self._prefix}:events:{thread_id}"

    def recent_key(self, thread_id: str) -> str:
        return f"{self._prefix}:recent:{thread_id}"

    def publish(self, event: Event) -> None:
        self.publish_all([event])

    def publish_all(self, events: list[Event]) -> None:
        """Publish ``events`` in order, in one round trip (the slice end's script, without
        its dedup and release)."""
        if not events:
            return
        first = events[0]
        keys = [self.channel(first.thread_id)] * 3  # the end's lease and dedup keys: unused
        try:
            if len(events) == 1 and isinstance(first, Chunk):
                self._publish_chunk(first)
                return
            self._publish(keys=keys, args=["", 1, 0, *self.script_args(keys, events)])
        except redis.RedisError:
            kinds = ", ".join(sorted({e.kind for e in events}))
            log.warning("publishing %s events failed", kinds, exc_info=True)

    def _publish_chunk(self, chunk: Chunk) -> None:
        """One live chunk: a plain ``PUBLISH`` while its thread is known unwatched, else the
        script that also appends it to the live log (and says whether anyone watches)."""
        now = time.monotonic()
        channel, data = self.channel(chunk.thread_id), _json(chunk)
        attempt, until = self._unwatched.get(chunk.thread_id, ("", 0.0))
        if attempt == chunk.attempt and until > now:
            self._client.publish(channel, data)
            return
        keys = live_keys(self._prefix, chunk.thread_id)
        if self._chunk(keys=keys, args=[channel, data, chunk.attempt, LIVE_KEEP]):
            self._unwatched.pop(chunk.thread_id, None)
            return
        if len(self._unwatched) > 10_000:  # bounded: forget the lot, ask again
            self._unwatched.clear()
        self._unwatched[chunk.thread_id] = (chunk.attempt, now + _UNWATCHED_S)

    def script_args(self, keys: list[str], events: list[Event]) -> list[str | int]:
        """The end script's arguments for ``events``, after the dedup ids: each published on
        its thread's channel, the non-chunk ones kept in its recent list, all appended to
        its live log if watched. Adds the lists' and logs' keys to ``keys``."""
        lists: dict[str, int] = {}
        published: list[str | int] = []
        datas: list[str] = []
        for event in events:
            kept = 0
            data = _json(event)
            datas.append(data)
            if not isinstance(event, Chunk):
                recent = self.recent_key(event.thread_id)
                if recent not in lists:
                    keys.append(recent)
                    lists[recent] = len(keys)  # Lua's KEYS are 1-based
                kept = lists[recent]
            published += [self.channel(event.thread_id), kept, data]
        logs: dict[str, int] = {}
        live: list[str | int] = []
        for event, data in zip(events, datas, strict=True):
            if event.thread_id not in logs:
                keys += live_keys(self._prefix, event.thread_id)
                logs[event.thread_id] = len(keys) - 2
            live += [logs[event.thread_id], *live_args(event, data)]
        args: list[str | int] = [self.keep, _ms(self.ttl_s), len(events), len(lists), *published]
        return [*args, LIVE_KEEP, len(events), *live]

    def recent(self, thread_id: str) -> list[Event]:
        """The kept events of ``thread_id``, oldest first (chunks are never kept)."""
        raw = cast(list[Any], self._client.lrange(self.recent_key(thread_id), 0, -1))
        return [EventAdapter.validate_json(data) for data in raw]


class RedisSliceEnd:
    """``SliceEnd`` in one command (``EVALSHA``): the ids the slice applied (dedup fast
    path), its events and the release of its lease, in that order.

    Each event is still its own message on the thread's channel, but only the first is
    published when nobody receives it: ``PUBLISH`` answers how many subscribers got it
    (pattern subscriptions included), and a channel that answered 0 gets no more of this
    slice's events. A slice nobody watches publishes once.
    The non-chunk events are kept for ``RedisEvents.recent`` whether or not anyone listens.
    """

    def __init__(
        self, client: Redis, lease: RedisLease, dedup: RedisDedup, events: RedisEvents
    ) -> None:
        self._lease = lease
        self._dedup = dedup
        self._events = events
        self._end = client.register_script(_END)

    def end(self, thread_id: str, token: str, message_ids: list[str], events: list[Event]) -> bool:
        keys = [*self._lease.keys(thread_id), self._dedup.key(thread_id)]
        args: list[str | int] = [token, _ms(self._dedup.ttl_s), len(message_ids), *message_ids]
        args += self._events.script_args(keys, events)
        try:
            refused = self._end(keys=keys, args=args)
        except redis.RedisError:
            log.warning(
                "ending the slice of thread %s in Redis failed: its lease expires on its own",
                thread_id,
                exc_info=True,
            )
            raise
        return bool(refused)
