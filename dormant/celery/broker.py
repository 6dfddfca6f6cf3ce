"""kombu's Redis transport, with one defect worked around: a closed connection's channel.

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
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["TRANSPORT", "Channel", "Transport"]

TRANSPORT = "dormant.celery.broker:Transport"
"""``broker_transport`` for a ``redis://`` broker URL."""


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            raise RedisConnectionError(
                "the broker connection is closed: unacknowledged messages are left to the "
                "visibility timeout"
            )
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    Channel = Channel
