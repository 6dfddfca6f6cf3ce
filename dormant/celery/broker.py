"""kombu's Redis transport, with one defect worked around (a closed connection's channel),
one cost removed (a client built for every command) and a wake's claim carried in a publish.

When a worker loses its Redis broker with tasks in flight, Celery's consumer first
``collect()``s the broken connection (which closes the transport and sets its ``client``
to None) and then closes it again. Closing a channel that still holds unacknowledged
messages restores them to Redis, which builds a new connection pool from the transport's
``client``: ``AttributeError: 'NoneType' object has no attribute 'hostname'`` in
``Channel._connparams``. It is not one of the transport's connection errors, so Celery's
``ignore_errors`` lets it through and the worker stops with "Unrecoverable error" instead
of reconnecting (kombu#582 and kombu#970 are the same hole reached by other paths).

Here a channel whose transport was closed reports a *connection error* instead, the error
kombu and Celery already handle: the restore is skipped (the broker redelivers the messages
after its visibility timeout, and dormant's sweeper re-drives the work from SQL sooner) and
the worker reconnects. Celery selects this class through ``broker_transport`` (a fully
qualified class path is a documented kombu transport name).

A connection's URI (``Connection.as_uri``) names the transport, and a class path there
(``dormant.celery.broker:Transport://...``) is a scheme no reader knows: Flower picks its
Broker page's client by that scheme and answered 404, "'redis' broker is not supported".
kombu's alias table makes the URI read ``redis://`` (as ``pyamqp`` reads ``amqp``); the
connection keeps this transport.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from kombu import connection as kombu_connection
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["CARRIED_CLAIM", "TRANSPORT", "CarriedClaim", "Channel", "Transport"]

TRANSPORT = "dormant.celery.broker:Transport"
"""``broker_transport`` for a ``redis://`` broker URL."""

kombu_connection.resolve_aliases.setdefault(TRANSPORT, "redis")

# KEYS[1] the queue's priority list, KEYS[2] the thread's wake mark; ARGV[1] the wake's
# priority, ARGV[2] the mark's ttl in ms, ARGV[3] the message: ``RedisWakeMarks``' claim,
# and the message pushed only if the claim admits it. 1 if pushed.
_CLAIM_AND_PUSH = """
local queued = tonumber(redis.call('GET', KEYS[2]) or '-1')
if queued >= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('LPUSH', KEYS[1], ARGV[3])
return 1
"""


@dataclass
class CarriedClaim:
    """A wake's claim (``RedisWakeMarks.claim``) carried in the publish of its slice task,
    when the marks live on the broker's Redis: one round trip instead of two. Set in
    ``CARRIED_CLAIM`` around ``send_task``; ``admitted`` says what the script decided, or
    stays None when the message went out without it (the claim was then not made)."""

    mark_key: str
    priority: int
    ttl_ms: int
    admitted: bool | None = None


CARRIED_CLAIM: ContextVar[CarriedClaim | None] = ContextVar("dormant_carried_claim", default=None)


class Channel(kombu_redis.Channel):
    _shared_client: Any = None

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        """Push ``message``; with a claim carried, only if the claim admits it, in one
        script. The script is sent by ``EVAL``, whose keys the transport's prefixing
        client leaves alone: the queue's key is prefixed here, the mark's never is."""
        claim = CARRIED_CLAIM.get()
        if claim is None or kwargs.get("_publish_batch") is not None or self._expires:
            super()._put(queue, message, **kwargs)  # type: ignore[no-untyped-call]
            return
        priority = self._get_message_priority(message, reverse=False)  # type: ignore[no-untyped-call]
        key = self.global_keyprefix + self._q_for_pri(queue, priority)  # type: ignore[no-untyped-call]
        args = (claim.priority, claim.ttl_ms, dumps(message))  # type: ignore[no-untyped-call]
        pushed = self._one_client().eval(_CLAIM_AND_PUSH, 2, key, claim.mark_key, *args)
        claim.admitted = bool(pushed)

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """The client for a publish, an acknowledgement or an event: kombu builds a new one
        each time (with its own copy of redis-py's ~200 response callbacks), about a tenth
        of a busy worker's CPU; here one client on the channel's pool serves them all (a
        redis-py client is safe to share between threads: each command takes a connection
        from the pool)."""
        yield client if client else self._one_client()

    def _one_client(self) -> Any:
        """The channel's one synchronous client, built again when kombu replaces its pool
        (after a fork, or a lost connection)."""
        pool = self.pool
        client = self._shared_client
        if client is None or client.connection_pool is not pool:
            client = self._shared_client = self._create_client()  # type: ignore[no-untyped-call]
        return client

    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            raise RedisConnectionError(
                "the broker connection is closed: unacknowledged messages are left to the "
                "visibility timeout"
            )
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    Channel = Channel
