"""The producer-only Celery app of a ``Client``, with broker connections of its own.

Celery keeps an app's broker connections in kombu's process-wide pools, keyed by broker URL
and transport options: every app of a process with the same broker shares them. A client
closes its connections when it is closed (a RabbitMQ connection left open holds a process
on the broker until this process exits), and closing the shared pool would break every
other app of the process on that broker: the next ``Client`` (each ``dormant`` command in
a test, a web process opening one per request) or the host's own Celery app, whose sends
then fail with ``RuntimeError: Acquire on closed pool``. Here the app's connection pool,
and the producer pool over it, belong to the app alone.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.app.amqp import AMQP
from kombu.pools import ProducerPool

__all__ = ["ProducerApp"]


class _OwnProducerPool(AMQP):  # type: ignore[misc]
    _producer_pool: Any

    @property
    def producer_pool(self) -> Any:
        if self._producer_pool is None:
            connections = self.app.pool
            self._producer_pool = ProducerPool(connections, limit=connections.limit)  # type: ignore[no-untyped-call]
        return self._producer_pool


class ProducerApp(Celery):  # type: ignore[misc]
    """A Celery app that only sends, from connection and producer pools of its own."""

    amqp_cls = f"{__name__}:_OwnProducerPool"
    _pool: Any

    @property
    def pool(self) -> Any:
        if self._pool is None:
            self._pool = self.connection_for_write().Pool(limit=self.conf.broker_pool_limit)
        return self._pool
