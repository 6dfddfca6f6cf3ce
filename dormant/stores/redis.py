"""What Redis holds in Celery mode: the lease, the dedup fast path, wake marks, live events.

All of it may be lost (a flush, a failover): SQL stays the truth. A lost lease is fenced by
the thread's version, a lost dedup id falls back on SQL's unique key, a lost wake mark only
costs a redundant task, a lost event only a live observer. Every key starts with
``Settings.key_prefix`` so deployments and test runs sharing a Redis never collide.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, cast

import redis

from dormant.messages import Chunk, Event, EventAdapter
from dormant.settings import Settings

__all__ = [
    "RedisDedup",
    "RedisEvents",
    "RedisLease",
    "RedisWakeMarks",
    "redis_client",
    "wake_mark_ttl_s",
]

log = logging.getLogger("dormant.redis")

Redis = redis.Redis

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
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


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


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisLease:
    """``Lease``: ``SET NX PX`` with a random token; renew and release only by the holder.

    Renew and release are Lua compare-and-set scripts, so a holder whose lease expired and
    was taken by another slice can neither extend nor delete the new holder's lease.
    """

    def __init__(self, client: Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def _key(self, thread_id: str) -> str:
        return f"{self._prefix}:lease:{thread_id}"

    def acquire(self, thread_id: str, ttl_s: float) -> str | None:
        token = secrets.token_hex(16)
        taken = self._client.set(self._key(thread_id), token, nx=True, px=_ms(ttl_s))
        return token if taken else None

    def renew(self, thread_id: str, token: str, ttl_s: float) -> bool:
        return bool(self._renew(keys=[self._key(thread_id)], args=[token, _ms(ttl_s)]))

    def release(self, thread_id: str, token: str) -> None:
        self._release(keys=[self._key(thread_id)], args=[token])

    def held(self, thread_id: str) -> bool:
        return bool(self._client.exists(self._key(thread_id)))


class RedisDedup:
    """``DedupSet``: one set of seen message ids per thread, expiring ``ttl_s`` after the
    last add so it stays bounded. A Redis failure reads as "not seen": SQL decides."""

    def __init__(self, client: Redis, prefix: str, ttl_s: float) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_s = ttl_s

    def _key(self, thread_id: str) -> str:
        return f"{self._prefix}:dedup:{thread_id}"

    def seen(self, thread_id: str, message_id: str) -> bool:
        try:
            return bool(self._client.sismember(self._key(thread_id), message_id))
        except redis.RedisError:
            log.warning(
                "dedup lookup failed for thread %s; relying on SQL", thread_id, exc_info=True
            )
            return False

    def add(self, thread_id: str, message_ids: list[str]) -> None:
        if not message_ids:
            return
        key = self._key(thread_id)
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.sadd(key, *message_ids)
                pipe.pexpire(key, _ms(self._ttl_s))
                pipe.execute()
        except redis.RedisError:
            log.warning("dedup add failed for thread %s; relying on SQL", thread_id, exc_info=True)


class RedisWakeMarks:
    """At most one queued slice task per thread and priority, as a hint: "a wake at least
    this urgent is already queued".

    The mark holds the highest priority queued. ``claim`` (a Lua compare-and-set) admits a
    wake only if nothing as urgent is queued: twenty tool results send one slice, but user
    text arriving behind them still sends its own to the interactive queue instead of
    waiting behind the background backlog. The slice ``clear``s the mark before it loads the
    inbox, so a message committed before a suppressed wake is always seen by a queued slice
    at least as urgent. A mark expires after ``ttl_s``, so a task the broker lost is re-sent
    by the sweeper after at most that long. On a Redis failure every wake is sent:
    duplicates are harmless, silence is not.
    """

    def __init__(self, client: Redis, prefix: str, ttl_s: float) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_s = ttl_s
        self._claim = client.register_script(_CLAIM)

    def _key(self, thread_id: str) -> str:
        return f"{self._prefix}:queued:{thread_id}"

    def claim(self, thread_id: str, priority: int) -> bool:
        """Whether this wake must be sent: no wake of ``priority`` or higher is queued."""
        try:
            key = self._key(thread_id)
            return bool(self._claim(keys=[key], args=[int(priority), _ms(self._ttl_s)]))
        except redis.RedisError:
            log.warning("wake mark failed for thread %s; sending anyway", thread_id, exc_info=True)
            return True

    def clear(self, thread_id: str) -> None:
        self._client.delete(self._key(thread_id))


class RedisEvents:
    """``EventSink``: every event is published as JSON on the thread's channel; events other
    than chunks are also kept in a list of the ``keep`` most recent (``LTRIM``) that expires
    ``ttl_s`` after the last one. Events are for live observers: failures are logged only."""

    def __init__(
        self, client: Redis, prefix: str, *, keep: int = 500, ttl_s: float = 24 * 3600.0
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._keep = keep
        self._ttl_s = ttl_s

    def channel(self, thread_id: str) -> str:
        return f"{self._prefix}:events:{thread_id}"

    def _recent_key(self, thread_id: str) -> str:
        return f"{self._prefix}:recent:{thread_id}"

    def publish(self, event: Event) -> None:
        data = EventAdapter.dump_json(event).decode()
        try:
            if isinstance(event, Chunk):  # the hot path: one command, no pipeline
                self._client.publish(self.channel(event.thread_id), data)
                return
            key = self._recent_key(event.thread_id)
            with self._client.pipeline(transaction=False) as pipe:
                pipe.publish(self.channel(event.thread_id), data)
                pipe.rpush(key, data)
                pipe.ltrim(key, -self._keep, -1)
                pipe.pexpire(key, _ms(self._ttl_s))
                pipe.execute()
        except redis.RedisError:
            log.warning(
                "publishing a %s event of thread %s failed",
                event.kind,
                event.thread_id,
                exc_info=True,
            )

    def recent(self, thread_id: str) -> list[Event]:
        """The kept events of ``thread_id``, oldest first (chunks are never kept)."""
        raw = cast(list[Any], self._client.lrange(self._recent_key(thread_id), 0, -1))
        return [EventAdapter.validate_json(data) for data in raw]
