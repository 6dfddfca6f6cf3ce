"""``CeleryDispatcher``: how a wake and a tool dispatch become Celery tasks, sent by name.

A client sends through ``client_dispatcher``'s producer-only app, a worker through its own
app: either way only task names cross, so a client never imports the tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dormant.celery.broker import CARRIED_CLAIM, TRANSPORT, CarriedClaim
from dormant.celery.config import (
    BROKER_SOCKET_TIMEOUT_S,
    QUEUE_BACKGROUND,
    QUEUE_INTERACTIVE,
    QUEUE_TOOLS,
    SLICE_TASK,
    TOOL_TASK,
    broker_priority,
    celery_config,
)
from dormant.stores.base import OutboxRow, Priority

if TYPE_CHECKING:
    from celery import Celery

    from dormant.celery.labels import TaskLabels  # imports the SQL store: not for Flower or beat
    from dormant.settings import Settings
    from dormant.stores.redis import RedisWakeMarks

__all__ = ["TRACE_HEADER", "CeleryDispatcher", "carries_claims", "client_dispatcher"]

TRACE_HEADER = "dormant_trace"
"""The Celery message header that carries an outbox row's trace context to its tool task
(``dormant.tracing.carrier``): the task builds its row from its arguments, and the header
saves it reading the row back. A slice's wake carries none: wakes are coalesced (one
queued slice for many rows), and the slice reads each row's context with the row."""


class CeleryDispatcher:
    """``Dispatcher`` by task name: a wake sends ``dormant.slice``, a dispatch ``dormant.tool``.

    With ``marks``, a wake is sent only if no slice of the thread at least as urgent is
    already queued (see ``RedisWakeMarks``): a thread receiving 20 tool results gets one or
    two slices, not 20, yet user text behind them still reaches the interactive queue.
    """

    def __init__(
        self,
        celery_app: Celery,
        marks: RedisWakeMarks | None = None,
        *,
        labels: TaskLabels | None = None,
    ) -> None:
        self._app = celery_app
        self._marks = marks
        self._labels = labels
        """Agent and tool names this process has seen: Flower's names for the tasks."""
        self._carry = marks is not None and carries_claims(celery_app, marks)
        """The marks live on the broker's Redis: a wake's claim rides in its publish."""

    def wake(self, thread_id: str, priority: int, countdown_s: float = 0.0) -> bool:
        claim: CarriedClaim | None = None
        if self._carry and self._marks is not None:
            claim = CarriedClaim(self._marks.key(thread_id), int(priority), self._marks.ttl_ms)
        elif self._marks is not None and not self._marks.claim(thread_id, priority):
            return False
        queue = QUEUE_INTERACTIVE if priority >= Priority.INTERACTIVE else QUEUE_BACKGROUND
        carried = CARRIED_CLAIM.set(claim)
        try:
            shadow = self._labels.slice_name(SLICE_TASK, thread_id) if self._labels else None
            kwargs = {"thread_id": thread_id}
            self._send(SLICE_TASK, kwargs, queue, priority, shadow, countdown_s=countdown_s)
        except BaseException:
            if self._marks is not None:
                self._marks.clear(thread_id)  # the next wake must not be suppressed
            raise
        finally:
            CARRIED_CLAIM.reset(carried)
        return claim is None or claim.admitted is not False

    def wake_in(self, thread_id: str, countdown_s: float) -> bool:
        """A background wake run after ``countdown_s``: a parked thread's turn, woken by the
        slice admitted before it (``SliceDeps.wake_in``). Short (``WAKE_AHEAD_S``, or one
        place away): a worker holds the task until then."""
        return self.wake(thread_id, Priority.BACKGROUND, countdown_s)

    def close_broker(self) -> None:
        """Close the app's broker connections: for the ``ProducerApp`` of
        ``client_dispatcher``, whose pools nothing else uses (a RabbitMQ connection left
        open holds a process on the broker until this process exits). ``Celery.close``
        alone only drops its reference to the pool."""
        self._app.pool.force_close_all()
        self._app.close()

    def dispatch(self, row: OutboxRow) -> None:
        kwargs = {
            "thread_id": row.thread_id,
            "call_id": row.call_id,
            "outbox_id": row.id,
            "action": row.action,
        }
        shadow = self._labels.tool_name(TOOL_TASK, row) if self._labels else None
        headers = {TRACE_HEADER: row.trace} if row.trace else None
        self._send(TOOL_TASK, kwargs, QUEUE_TOOLS, Priority.BACKGROUND, shadow, headers)

    def _send(
        self,
        name: str,
        kwargs: dict[str, Any],
        queue: str,
        priority: int,
        shadow: str | None = None,
        headers: dict[str, str] | None = None,
        *,
        countdown_s: float = 0.0,
    ) -> None:
        self._app.send_task(
            name,
            kwargs=kwargs,
            argsrepr="()",
            kwargsrepr=_kwargs_repr(kwargs),
            queue=queue,
            priority=broker_priority(self._app, priority),
            serializer="json",
            add_to_parent=False,
            shadow=shadow,  # Flower's and the log's name: dormant.slice[triage]
            headers=headers,
            confirm_timeout=BROKER_SOCKET_TIMEOUT_S,  # RabbitMQ: a stalled broker's confirm
            countdown=countdown_s if countdown_s > 0 else None,
        )


_REPR_MAX_CHARS = 1024
"""Celery's bound on a message's ``kwargsrepr`` (``AMQP.kwargsrepr_maxsize``)."""


def _kwargs_repr(kwargs: dict[str, Any]) -> str | None:
    """The task's keyword arguments as Flower and the worker's log show them: the ``repr``
    Celery's ``saferepr`` makes of a flat dict of ids, at about a fiftieth of its cost (15
    µs a send). None, to let Celery shorten it, past its bound."""
    text = repr(kwargs)
    return text if len(text) <= _REPR_MAX_CHARS else None


def carries_claims(celery_app: Celery, marks: RedisWakeMarks) -> bool:
    """Whether ``celery_app`` publishes through ``broker.Transport`` to the Redis server
    and database of ``marks``, so that a claim can ride in the publish (``CarriedClaim``).
    Anything else (RabbitMQ, another Redis, another transport) claims first, then sends."""
    from redis.connection import parse_url

    conf = celery_app.conf
    url = str(conf.broker_url or "")
    transport = getattr(conf, "broker_transport", None)
    if transport != TRANSPORT or not url.startswith("redis://") or ";" in url:
        return False
    try:
        broker = parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError:
        return False
    where = tuple(broker.get(name) for name in ("host", "port", "path", "db"))
    return where == marks.server()


def client_dispatcher(
    settings: Settings, marks: RedisWakeMarks | None, labels: TaskLabels | None = None
) -> CeleryDispatcher:
    """A dispatcher for client processes: a producer-only app (no tasks, no agents)."""
    from dormant.celery.producer_app import ProducerApp

    app = ProducerApp("dormant-client", set_as_current=False)
    app.conf.update(celery_config(settings))
    return CeleryDispatcher(app, marks, labels=labels)
