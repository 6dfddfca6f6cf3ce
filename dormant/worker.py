"""The Celery app: ``create_app``, ``install`` on an existing app, the default ``app``.

``celery -A dormant.worker worker`` finds the module attribute ``app``. It is built on first
access, through a module ``__getattr__`` (PEP 562), from ``Settings.from_env()`` and the
agents module named by ``DORMANT_AGENTS``: importing this module reads no environment and
imports no user code, yet ``celery worker``, ``celery beat`` and Flower get a fully
configured app. A custom loader or an ``on_configure`` signal would also defer the reads,
but would leave a half-built app importable; this attribute is either complete or an error.
Without ``DORMANT_AGENTS`` the app is built without agents, for the processes that run no
task (Flower, beat, ``celery inspect``); a worker started on it exits at once saying so.
``dormant worker`` builds its app explicitly with ``create_app``.

The configuration baseline and the names of queues and tasks are in ``celery/config.py``,
the dispatcher in ``celery/dispatch.py``; this module hands them on, as its public names.
Celery is imported here, in ``tasks.py`` and in ``dormant/celery/`` only.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.signals import (
    celeryd_init,
    worker_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from celery.utils.imports import cwd_in_path

from dormant.agents import NO_AGENTS, AgentRegistry, AgentSource, load_agents
from dormant.celery.config import (
    PRUNE_TASK,
    QUEUE_BACKGROUND,
    QUEUE_INTERACTIVE,
    QUEUE_TOOLS,
    QUEUES,
    SLICE_TASK,
    SWEEP_TASK,
    TOOL_TASK,
    broker_priority,
    broker_transport_options,
    celery_config,
    dormant_queues,
)
from dormant.celery.dispatch import CeleryDispatcher, client_dispatcher
from dormant.errors import ConfigurationError
from dormant.settings import Settings
from dormant.tools.mcp_session import close_mcp_sessions

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
    "bare_app",
    "broker_priority",
    "broker_transport_options",
    "celery_config",
    "client_dispatcher",
    "create_app",
    "install",
    "load_agents",
]

_log = logging.getLogger("dormant.worker")


_ROUTES = {
    SLICE_TASK: QUEUE_BACKGROUND,
    TOOL_TASK: QUEUE_TOOLS,
    SWEEP_TASK: QUEUE_BACKGROUND,
    PRUNE_TASK: QUEUE_BACKGROUND,
}


def create_app(settings: Settings | None = None, agents: AgentSource = None) -> Celery:
    """A Celery app running dormant: the baseline config and the tasks. The agents are
    loaded now, so a wrong ``DORMANT_AGENTS`` fails at start rather than at the first slice;
    like Celery's ``-A``, the module is looked up from the current directory too."""
    settings = settings or Settings.from_env()
    with cwd_in_path():
        registry = load_agents(agents, settings)
    return bare_app(settings, registry)


def bare_app(settings: Settings, agents: AgentSource) -> Celery:
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
    sweep, which runs in the app's beat process (``celery/beat_sweep.py``); the app's own
    defaults are left alone. The queues join ``task_queues`` beside the app's own (its
    default queue included), so every queue table built from the configuration has them,
    whatever reads it first (``celery purge``, a worker started without ``-Q``); ``-Q`` and
    ``-X`` still choose.
    The tasks carry the options that matter per task (late ack, JSON); run the workers that
    consume dormant's queues with ``worker_prefetch_multiplier = 1`` and ``-P threads``.
    """
    from dormant.celery.beat_sweep import start_on_beat
    from dormant.tasks import LazyRuntime, register_tasks

    resolve = _settings_resolver(settings)
    lock = threading.Lock()
    runtimes: list[LazyRuntime] = []
    loaded: list[AgentRegistry] = []  # a worker's agents, loaded as it starts

    def runtime() -> Any:
        with lock:  # the first tasks of a threads pool race here
            if not runtimes:
                source = loaded[0] if loaded else agents
                runtimes.append(LazyRuntime(celery_app, resolve(), source))
        return runtimes[0].get()

    register_tasks(celery_app, runtime)
    start_on_beat(celery_app, resolve, agents)

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

    def load_agents_at_start(sender: Any = None, **_: Any) -> None:
        """A worker of this app that consumes dormant's queues loads its agents as it
        starts: one that cannot (a mistyped module, one raising on import) would say
        ``ready.`` and then fail every slice, so it refuses to start, with one line. Sent
        in the worker's main process before its pool starts: prefork children inherit the
        loaded modules. A worker of the project's own queues only (``-Q proj``) runs no
        agent; beat, Flower, ``celery inspect`` and web processes start no worker."""
        if getattr(sender, "app", None) is not celery_app or not _consumes_ours(celery_app):
            return
        loaded.append(_agents_for_worker(agents, resolve()))

    def refuse_another_schema(sender: Any = None, **_: Any) -> None:
        """A worker on a schema of another version would say ``ready.`` and then fail every
        slice: it refuses to start, naming both versions (an unreachable database is let
        through; its store checks before the first transaction)."""
        if getattr(sender, "app", None) is not celery_app:
            return
        from dormant.cli.connect import check_schema

        try:
            check_schema(resolve())
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

    def withdraw(**_: Any) -> None:
        """A worker that stops cleanly leaves the roster at once: what it had is at once
        "not on a live worker" for the others, not three announce intervals later."""
        built = runtimes[0].built() if runtimes else None
        if built is None:
            return
        try:
            built.whereabouts.withdraw()
        except Exception as error:  # the store may be down: the card lapses on its own
            _log.warning("could not withdraw this worker's card from the roster (%s)", error)

    if celery_app.configured:
        add_routing()
    else:
        celery_app.on_after_configure.connect(add_routing, weak=False)
    celeryd_init.connect(before_worker, weak=False)
    worker_init.connect(refuse_without_secret, weak=False)
    worker_init.connect(load_agents_at_start, weak=False)
    worker_init.connect(refuse_another_schema, weak=False)
    worker_ready.connect(warm_up, weak=False)
    # The process's MCP sessions stop their servers: the worker's (threads, solo) or a
    # prefork child's, which leaves through os._exit and so never runs atexit.
    worker_shutdown.connect(_close_mcp_sessions, weak=False)
    worker_process_shutdown.connect(_close_mcp_sessions, weak=False)
    worker_shutdown.connect(withdraw, weak=False)
    worker_process_shutdown.connect(withdraw, weak=False)


def _consumes_ours(celery_app: Celery) -> bool:
    """Whether a worker, its ``-Q`` and ``-X`` applied, consumes one of dormant's queues."""
    consumed = celery_app.amqp.queues.consume_from
    return any(name in consumed for name in QUEUES)


def _agents_for_worker(agents: AgentSource, settings: Settings) -> AgentRegistry:
    """The agents, looked up from the current directory too (as Celery's ``-A``), or
    ``SystemExit`` with one line naming the module and what went wrong (not found, raising
    on import, no Agent in it, none configured)."""
    try:
        with cwd_in_path():
            return load_agents(agents, settings)
    except ConfigurationError as error:
        raise SystemExit(f"error: a worker cannot start: {error}") from None


def _close_mcp_sessions(**_: Any) -> None:
    close_mcp_sessions()


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
    _declare_ours(celery_app)
    # The sweep is not a beat entry: beat runs it itself (celery/beat_sweep.py), so an idle
    # deployment publishes nothing. Pruning is an hourly task, opt-in.
    if settings.prune_older_than_s > 0:  # retention is opt-in: deleting is the user's call
        conf.beat_schedule = {**(conf.beat_schedule or {})}
        conf.beat_schedule[PRUNE_TASK] = {
            "task": PRUNE_TASK,
            "schedule": settings.prune_interval_s,
            "options": {"queue": QUEUE_BACKGROUND, "expires": settings.prune_interval_s},
        }


def _declare_ours(celery_app: Celery) -> None:
    """Add dormant's queues to ``task_queues``, which every queue table is built from.

    This runs as the configuration loads, and that may be inside the first read of
    ``app.amqp.queues`` (``celery purge`` reads it first): a table built here would be
    replaced by the one that read then builds from ``task_queues``. So the queues go into
    the configuration, with the app's own (its default queue included, as Celery declares
    it when ``task_queues`` is unset); only a table built before ``install`` is added to.
    """
    conf = celery_app.conf
    declared = celery_app.amqp.Queues(conf.task_queues)  # a new table: the cached one is left
    ours = [queue for queue in dormant_queues() if queue.name not in declared]
    conf.task_queues = [*declared.values(), *ours]
    if "queues" in vars(celery_app.amqp):  # read before install: that table stays in use
        _consume_ours(celery_app)


def _consume_ours(celery_app: Celery) -> None:
    queues = celery_app.amqp.queues  # built from the app's own settings, default queue included
    for queue in dormant_queues():
        if queue.name not in queues or queue.name not in queues.consume_from:
            # select_add, not add: a worker without -Q consumes the queues present when
            # the table was built (plus these); add would leave them routed but unread.
            queues.select_add(queue)


@functools.cache
def _default_app() -> Celery:
    """The app of ``celery -A dormant.worker``, from ``DORMANT_*``. A bad variable ends
    the command with one line: Celery would print its traceback under "Unable to load
    celery application" (an application builds its own with ``create_app``)."""
    try:
        settings = Settings.from_env()
    except ConfigurationError as error:
        raise SystemExit(f"error: {error}") from None
    if settings.agents_module:
        return create_app(settings)
    app = bare_app(settings, None)

    def refuse_worker(instance: Any, **_: Any) -> None:
        if instance.app is app:
            raise SystemExit(f"error: a worker cannot start: {NO_AGENTS}")

    celeryd_init.connect(refuse_worker, weak=False)
    return app


def __getattr__(name: str) -> Any:
    if name == "app":
        return _default_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
