"""The Celery configuration baseline of DESIGN section 7: queue and task names, the
broker's transport options, and priorities as each broker reads them.

Shared by the worker's app (``dormant.worker``) and a client's producer-only app
(``dispatch.py``), which must send exactly what the workers consume.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kombu.entity import Exchange, Queue

from dormant.errors import ConfigurationError

if TYPE_CHECKING:
    from celery import Celery

    from dormant.settings import Settings

__all__ = [
    "BROKER_SOCKET_TIMEOUT_S",
    "PRUNE_TASK",
    "QUEUES",
    "QUEUE_BACKGROUND",
    "QUEUE_INTERACTIVE",
    "QUEUE_TOOLS",
    "SLICE_TASK",
    "SWEEP_TASK",
    "TOOL_TASK",
    "broker_priority",
    "broker_transport_options",
    "celery_config",
    "dormant_queues",
    "is_redis",
]

QUEUE_INTERACTIVE = "dormant.interactive"
"""Slices woken by user text."""
QUEUE_BACKGROUND = "dormant.background"
"""Slices woken by tool results, events and timers."""
QUEUE_TOOLS = "dormant.tools"
QUEUES = (QUEUE_INTERACTIVE, QUEUE_BACKGROUND, QUEUE_TOOLS)
SLICE_TASK = "dormant.slice"
TOOL_TASK = "dormant.tool"
SWEEP_TASK = "dormant.sweep"
PRUNE_TASK = "dormant.prune"

REDIS_PRIORITY_STEPS = (0, 3, 6, 9)
"""kombu's Redis priority lists; our levels 8, 4 and 0 land on three different steps."""
BROKER_SOCKET_TIMEOUT_S = 10.0
"""The longest a broker may leave a send (or a worker's command) unanswered. Without it a
Redis broker that stalls without closing its connections (stopped, partitioned) blocks
``Client.send`` for as long as it stalls: kombu's Redis transport waits for ever by default,
and a RabbitMQ publisher confirm as well. After it the wake fails like a refused one, and
``Client.send`` still returns: the message is stored, and the sweeper wakes the thread."""
BROKER_CONNECT_TIMEOUT_S = 5.0
"""The longest a Redis broker may take to accept a connection."""
_REDIS_SCHEMES = frozenset({"redis", "rediss", "sentinel", "redis+socket", "socket"})
_AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})


def dormant_queues() -> list[Queue]:
    # max_priority declares x-max-priority on RabbitMQ; Redis uses priority lists instead.
    return [
        Queue(name, Exchange(name, type="direct"), routing_key=name, max_priority=9)  # type: ignore[no-untyped-call]
        for name in QUEUES
    ]


def _scheme(broker_url: str) -> str:
    return urlsplit(broker_url.split(";")[0]).scheme  # "a;b": failover URLs share a transport


def is_redis(broker_url: str) -> bool:
    return _scheme(broker_url) in _REDIS_SCHEMES


def _is_amqp(broker_url: str) -> bool:
    return _scheme(broker_url) in _AMQP_SCHEMES


def broker_transport_options(settings: Settings) -> dict[str, Any]:
    """Options for the broker's kombu transport, which differ by broker.

    Redis emulates acknowledgement (a visibility timeout) and priorities (one list per
    priority step); RabbitMQ does both itself, and publisher confirms make a send return
    only once the broker has taken the message. A Redis-only setting that a RabbitMQ
    broker would silently ignore is refused instead.
    """
    if is_redis(settings.broker_url):
        return _redis_transport_options(settings)
    if settings.broker_key_prefix:
        raise ConfigurationError(
            "DORMANT_BROKER_KEY_PREFIX applies to a Redis broker only; to share a RabbitMQ"
            " broker, give each deployment its own virtual host (amqp://host:5672/vhost)"
        )
    if _is_amqp(settings.broker_url):
        return {"confirm_publish": True}
    return {}


def _redis_transport_options(settings: Settings) -> dict[str, Any]:
    restore_s = max(1.0, min(10.0, settings.visibility_timeout_s / 10))
    transport: dict[str, Any] = {
        # Above the longest slice: an unacked task is handed to another worker after it.
        "visibility_timeout": settings.visibility_timeout_s,
        # A dead worker's tasks come back within visibility_timeout + restore_s.
        "unacked_restore_interval": restore_s,
        "unacked_restore_throttle": 1,
        # BRPOP walks the lists in (priority step, queue) order: priorities span queues.
        "queue_order_strategy": "priority",
        "priority_steps": list(REDIS_PRIORITY_STEPS),
        # A stalled broker fails a send instead of blocking it (kombu's default is no limit).
        "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": BROKER_CONNECT_TIMEOUT_S,
    }
    if settings.broker_key_prefix:
        transport["global_keyprefix"] = settings.broker_key_prefix
    return transport


def celery_config(settings: Settings) -> dict[str, Any]:
    """The configuration baseline of DESIGN section 7, for an app dormant owns."""
    return {
        "broker_url": settings.broker_url,
        **_broker_transport(settings.broker_url),
        # A worker rides out a broker restart or outage of any length: it reconnects for
        # ever (Celery's default gives up after 100 tries and the worker exits).
        "broker_connection_retry_on_startup": True,
        "broker_connection_retry": True,
        "broker_connection_max_retries": None,
        "broker_transport_options": broker_transport_options(settings),
        # JSON only: a message is data, never code.
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        # A task is acknowledged when it ends, so a worker's death hands it to another.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # On a lost broker connection the running tasks' messages are redelivered; a thread
        # cannot be cancelled, but the redelivered slice is fenced by the lease and version.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # Flower shows every slice, its thread_id kwarg and its outcome string (sent in the
        # task-succeeded event); no result backend is needed for that. No task-sent events:
        # they carry the task's real name, not its display name (dormant.slice[triage]),
        # and Flower would rename a row back when one arrives after the worker's events.
        # Queued tasks are counted on Flower's Broker page.
        "worker_send_task_events": True,
        "task_send_sent_event": False,
        "task_ignore_result": True,
        "result_backend": None,
        "task_queues": dormant_queues(),
        "task_default_queue": QUEUE_BACKGROUND,
        # The sweep's schedule is static and idempotent: nothing to persist (and no shelve,
        # which pickles).
        "beat_scheduler": "celery.beat:Scheduler",
    }


def _broker_transport(broker_url: str) -> dict[str, Any]:
    """``dormant.broker``'s Redis transport for a plain ``redis://`` broker (it survives a
    broker lost with tasks in flight; see its docstring); others keep kombu's choice."""
    if urlsplit(broker_url.split(";")[0]).scheme == "redis":
        from dormant.celery.broker import TRANSPORT

        return {"broker_transport": TRANSPORT}
    return {}


def broker_priority(celery_app: Celery, priority: int) -> int:
    """dormant's priority (higher first, as in AMQP) as the broker reads it: kombu's Redis
    transport serves the lowest number first, so there it is inverted."""
    level = max(0, min(9, int(priority)))
    return 9 - level if is_redis(str(celery_app.conf.broker_url or "")) else level
