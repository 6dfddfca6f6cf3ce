"""The Celery app: its configuration baseline, ``install`` on an existing app, the dispatcher.

``celery -A dormant.worker worker`` finds the module attribute ``app``. It is built on first
access, through a module ``__getattr__`` (PEP 562), from ``Settings.from_env()`` and the
agents module named by ``DORMANT_AGENTS``: importing this module reads no environment and
imports no user code, yet ``celery worker``, ``celery beat`` and Flower get a fully
configured app. A custom loader or an ``on_configure`` signal would also defer the reads,
but would leave a half-built app importable; this attribute is either complete or an error.
Without ``DORMANT_AGENTS`` the app is built without agents, for the processes that run no
task (Flower, beat, ``celery inspect``); a worker started on it exits at once saying so.
``dormant worker`` builds its app explicitly with ``create_app``.

Celery is imported here and in ``tasks.py``, ``producer_app.py`` and ``worker_process.py``
only.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from celery import Celery
from celery.signals import celeryd_init, worker_init, worker_ready
from celery.utils.imports import cwd_in_path
from kombu.entity import Exchange, Queue

from dormant.agents import Agent, AgentRegistry
from dormant.errors import ConfigurationError
from dormant.settings import Settings
from dormant.stores.base import OutboxRow, Priority
from dormant.stores.redis import RedisWakeMarks

if TYPE_CHECKING:
    from dormant.labels import TaskLabels  # imports the SQL store: not for Flower or beat

__all__ = [
    "PRUNE_TASK",
    "QUEUES",
    "QUEUE_BACKGROUND",
    "QUEUE_INTERACTIVE",
    "QUEUE_TOOLS",
    "SLICE_TASK",
    "SWEEP_TASK",
    "TOOL_TASK",
    "AgentSource",
    "CeleryDispatcher",
    "SettingsSource",
    "broker_priority",
    "broker_transport_options",
    "celery_config",
    "client_dispatcher",
    "create_app",
    "install",
    "load_agents",
]

_log = logging.getLogger("dormant.worker")

QUEUE_INTERACTIVE = "dormant.interactive"
"""Slices woken by user text."""
QUEUE_BACKGROUND = "dormant.background"
"""Slices woken by tool results, events and timers; the sweep."""
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
SWEEP_EXPIRES_MIN_S = 60.0


def sweep_expires_s(settings: Settings) -> float:
    """How late a queued sweep may still run. Sweeps are idempotent, and a backlog is when
    stranded work most needs one: a sweep that expired after one interval was dropped
    whenever it waited longer than that behind busy slots, so under sustained load (the
    queue drained slower than beat filled it) every sweep expired and no stranded thread
    was ever woken again. Only sweeps queued through a long outage are dropped."""
    return max(SWEEP_EXPIRES_MIN_S, 10 * settings.sweep_interval_s)


_REDIS_SCHEMES = frozenset({"redis", "rediss", "sentinel", "redis+socket", "socket"})
_AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})

_NO_AGENTS = "no agents: set DORMANT_AGENTS to a module, e.g. myapp.agents"

AgentSource = AgentRegistry | Iterable[Agent] | str | None
"""Agents as a registry, a list, a module path (``"myapp.agents"``), or None for
``Settings.agents_module``."""


def load_agents(source: AgentSource, settings: Settings) -> AgentRegistry:
    if isinstance(source, AgentRegistry):
        return source
    if source is None:
        if not settings.agents_module:
            raise ConfigurationError(_NO_AGENTS)
        return AgentRegistry.from_module(settings.agents_module)
    if isinstance(source, str):
        return AgentRegistry.from_module(source)
    return AgentRegistry(source)


def _dormant_queues() -> list[Queue]:
    # max_priority declares x-max-priority on RabbitMQ; Redis uses priority lists instead.
    return [
        Queue(name, Exchange(name, type="direct"), routing_key=name, max_priority=9)  # type: ignore[no-untyped-call]
        for name in QUEUES
    ]


def _scheme(broker_url: str) -> str:
    return urlsplit(broker_url.split(";")[0]).scheme  # "a;b": failover URLs share a transport


def _is_redis(broker_url: str) -> bool:
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
    if _is_redis(settings.broker_url):
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
        "task_queues": _dormant_queues(),
        "task_default_queue": QUEUE_BACKGROUND,
        # The sweep's schedule is static and idempotent: nothing to persist (and no shelve,
        # which pickles).
        "beat_scheduler": "celery.beat:Scheduler",
    }


def _broker_transport(broker_url: str) -> dict[str, Any]:
    """``dormant.broker``'s Redis transport for a plain ``redis://`` broker (it survives a
    broker lost with tasks in flight; see its docstring); others keep kombu's choice."""
    if urlsplit(broker_url.split(";")[0]).scheme == "redis":
        from dormant.broker import TRANSPORT

        return {"broker_transport": TRANSPORT}
    return {}


def create_app(settings: Settings | None = None, agents: AgentSource = None) -> Celery:
    """A Celery app running dormant: the baseline config and the tasks. The agents are
    loaded now, so a wrong ``DORMANT_AGENTS`` fails at start rather than at the first slice;
    like Celery's ``-A``, the module is looked up from the current directory too."""
    settings = settings or Settings.from_env()
    with cwd_in_path():
        registry = load_agents(agents, settings)
    return _bare_app(settings, registry)


def _bare_app(settings: Settings, agents: AgentSource) -> Celery:
    app = Celery("dormant")
    app.conf.update(celery_config(settings))
    install(app, agents, settings=settings)
    return app


SettingsSource = Settings | Callable[[], Settings] | None
"""Settings, a function returning them (read when first needed: Django's settings are not
loaded when ``proj/celery.py`` is imported), or None for ``Settings.from_env()``."""


def install(
    celery_app: Celery, agents: AgentSource = None, *, settings: SettingsSource = None
) -> None:
    """Register dormant's tasks on an existing app (Django's ``proj/celery.py``).

    Only adds: the three tasks, the three queues, routes for dormant's task names and the
    sweep's beat entry; the app's own defaults are left alone. The queues join the set a
    worker started without ``-Q`` consumes (Celery 5 fixes that set when the queue table is
    built, so a plain ``add`` would only route to them); ``-Q`` and ``-X`` still choose.
    The tasks carry the options that matter per task (late ack, JSON); run the workers that
    consume dormant's queues with ``worker_prefetch_multiplier = 1`` and ``-P threads``.
    """
    from dormant.tasks import LazyRuntime, register_tasks

    resolve = _settings_resolver(settings)
    lock = threading.Lock()
    runtimes: list[LazyRuntime] = []

    def runtime() -> Any:
        with lock:  # the first tasks of a threads pool race here
            if not runtimes:
                runtimes.append(LazyRuntime(celery_app, resolve(), agents))
        return runtimes[0].get()

    register_tasks(celery_app, runtime)

    def add_routing(**_: Any) -> None:
        _add_routing(celery_app, resolve())

    def before_worker(instance: Any = None, **_: Any) -> None:
        # Sent just before the worker applies -Q/-X: the queue table is certainly built from
        # the final configuration by now (it may not be when configuration first loads).
        if getattr(instance, "app", None) is celery_app:
            _consume_ours(celery_app)

    def refuse_without_secret(sender: Any = None, **_: Any) -> None:
        """A worker of this app without a signing key would fail every slice: it refuses
        to start, with one line (beat and Flower need no key and are not workers)."""
        if getattr(sender, "app", None) is not celery_app:
            return
        try:
            resolve().require_secret()
        except ConfigurationError as error:
            raise SystemExit(f"error: {error}") from None

    def warm_up(sender: Any = None, **_: Any) -> None:
        """Build the runtime (the SQL store's imports, its engine, Redis) as soon as the
        worker is ready, on a thread, rather than inside its first slice. Only for the pools
        that run tasks in this process: a prefork child builds its own after the fork."""
        if getattr(sender, "app", None) is not celery_app:
            return
        if type(getattr(sender, "pool", None)).__module__ not in _IN_PROCESS_POOLS:
            return
        threading.Thread(target=_warm, args=(runtime,), name="dormant-warm-up", daemon=True).start()

    if celery_app.configured:
        add_routing()
    else:
        celery_app.on_after_configure.connect(add_routing, weak=False)
    celeryd_init.connect(before_worker, weak=False)
    worker_init.connect(refuse_without_secret, weak=False)
    worker_ready.connect(warm_up, weak=False)


_IN_PROCESS_POOLS = frozenset({"celery.concurrency.thread", "celery.concurrency.solo"})


def _warm(runtime: Callable[[], object]) -> None:
    try:
        runtime()
    except Exception:  # the first task raises it again, where it is reported
        _log.warning("building the dormant runtime ahead of the first task failed", exc_info=True)


def _settings_resolver(settings: SettingsSource) -> Callable[[], Settings]:
    if isinstance(settings, Settings):
        fixed = settings
        return lambda: fixed
    return functools.cache(settings or Settings.from_env)


def _add_routing(celery_app: Celery, settings: Settings) -> None:
    conf = celery_app.conf
    ours = {name: {"queue": queue} for name, queue in _ROUTES.items()}
    existing = conf.task_routes
    if existing is None:
        existing = ()
    elif isinstance(existing, dict | str):
        existing = (existing,)
    conf.task_routes = (ours, *existing)
    _consume_ours(celery_app)
    conf.beat_schedule = {
        **(conf.beat_schedule or {}),
        SWEEP_TASK: {
            "task": SWEEP_TASK,
            "schedule": settings.sweep_interval_s,
            "options": {
                "queue": QUEUE_BACKGROUND,
                "priority": broker_priority(celery_app, Priority.INTERACTIVE),
                "expires": sweep_expires_s(settings),
            },
        },
    }
    if settings.prune_older_than_s > 0:  # retention is opt-in: deleting is the user's call
        conf.beat_schedule[PRUNE_TASK] = {
            "task": PRUNE_TASK,
            "schedule": settings.prune_interval_s,
            "options": {"queue": QUEUE_BACKGROUND, "expires": settings.prune_interval_s},
        }


def _consume_ours(celery_app: Celery) -> None:
    queues = celery_app.amqp.queues  # built from the app's own settings, default queue included
    for queue in _dormant_queues():
        if queue.name not in queues or queue.name not in queues.consume_from:
            # select_add, not add: a worker without -Q consumes the queues present when
            # the table was built (plus these); add would leave them routed but unread.
            queues.select_add(queue)


_ROUTES = {
    SLICE_TASK: QUEUE_BACKGROUND,
    TOOL_TASK: QUEUE_TOOLS,
    SWEEP_TASK: QUEUE_BACKGROUND,
    PRUNE_TASK: QUEUE_BACKGROUND,
}


def broker_priority(celery_app: Celery, priority: int) -> int:
    """dormant's priority (higher first, as in AMQP) as the broker reads it: kombu's Redis
    transport serves the lowest number first, so there it is inverted."""
    level = max(0, min(9, int(priority)))
    return 9 - level if _is_redis(str(celery_app.conf.broker_url or "")) else level


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

    def wake(self, thread_id: str, priority: int) -> None:
        if self._marks is not None and not self._marks.claim(thread_id, priority):
            return
        queue = QUEUE_INTERACTIVE if priority >= Priority.INTERACTIVE else QUEUE_BACKGROUND
        try:
            shadow = self._labels.slice_name(SLICE_TASK, thread_id) if self._labels else None
            self._send(SLICE_TASK, {"thread_id": thread_id}, queue, priority, shadow)
        except BaseException:
            if self._marks is not None:
                self._marks.clear(thread_id)  # the next wake must not be suppressed
            raise

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
        self._send(TOOL_TASK, kwargs, QUEUE_TOOLS, Priority.BACKGROUND, shadow)

    def _send(
        self,
        name: str,
        kwargs: dict[str, Any],
        queue: str,
        priority: int,
        shadow: str | None = None,
    ) -> None:
        self._app.send_task(
            name,
            kwargs=kwargs,
            queue=queue,
            priority=broker_priority(self._app, priority),
            serializer="json",
            add_to_parent=False,
            shadow=shadow,  # Flower's and the log's name: dormant.slice[triage]
            confirm_timeout=BROKER_SOCKET_TIMEOUT_S,  # RabbitMQ: a stalled broker's confirm
        )


def client_dispatcher(
    settings: Settings, marks: RedisWakeMarks | None, labels: TaskLabels | None = None
) -> CeleryDispatcher:
    """A dispatcher for client processes: a producer-only app (no tasks, no agents)."""
    from dormant.producer_app import ProducerApp

    app = ProducerApp("dormant-client", set_as_current=False)
    app.conf.update(celery_config(settings))
    return CeleryDispatcher(app, marks, labels=labels)


@functools.cache
def _default_app() -> Celery:
    settings = Settings.from_env()
    if settings.agents_module:
        return create_app(settings)
    app = _bare_app(settings, None)

    def refuse_worker(instance: Any, **_: Any) -> None:
        if instance.app is app:
            raise SystemExit(f"error: a worker cannot start: {_NO_AGENTS}")

    celeryd_init.connect(refuse_worker, weak=False)
    return app


def __getattr__(name: str) -> Any:
    if name == "app":
        return _default_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
