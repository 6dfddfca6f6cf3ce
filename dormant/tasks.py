"""Thin Celery tasks: decode the arguments, call a plain function, map the outcome.

``dormant.slice(thread_id)`` runs ``run_slice`` and returns a short outcome string (Flower
shows it); a model failure is retried by Celery with a short countdown until the store
stalls the thread. ``dormant.tool(...)`` runs ``execute_outbox``; ``dormant.sweep()`` runs
``sweep_once``. A test crash point kills the worker process with SIGKILL, so tests
exercise real deaths: the unacknowledged task and the lease are left behind, as in a crash.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

import redis
from celery import Celery, Task

from dormant.agents import AgentRegistry
from dormant.client import Client
from dormant.errors import CrashPoint, LeaseLost, NotFound
from dormant.settings import Settings
from dormant.slice import (
    Busy,
    Closed,
    Failed,
    Idle,
    Missing,
    SliceDeps,
    SliceOutcome,
    Stale,
    Stalled,
    Steered,
    Waiting,
    run_slice,
)
from dormant.stores.base import OutboxRow
from dormant.stores.redis import (
    RedisDedup,
    RedisEvents,
    RedisLease,
    RedisWakeMarks,
    redis_client,
    wake_mark_ttl_s,
)
from dormant.stores.sql import SQLStore
from dormant.sweeper import sweep_once
from dormant.tools.runner import execute_outbox
from dormant.worker import (
    SLICE_TASK,
    SWEEP_TASK,
    TOOL_TASK,
    AgentSource,
    CeleryDispatcher,
    load_agents,
)

__all__ = ["LazyRuntime", "Runtime", "outcome_text", "register_tasks"]

log = logging.getLogger("dormant.tasks")


@dataclass(frozen=True)
class Runtime:
    """What the tasks of one worker process share: the store, Redis, agents, dispatcher."""

    settings: Settings
    store: SQLStore
    marks: RedisWakeMarks
    dispatcher: CeleryDispatcher
    client: Client
    """The tools' sink: their results and events go in like any client's messages."""
    deps: SliceDeps

    @classmethod
    def build(cls, celery_app: Celery, settings: Settings, agents: AgentRegistry) -> Runtime:
        settings = settings.require_secret()  # tools' callback URLs are signed
        client = redis_client(settings)
        prefix = settings.key_prefix
        store = SQLStore(settings.database_url, table_prefix=settings.table_prefix)
        lease = RedisLease(client, prefix)
        dedup = RedisDedup(client, prefix, settings.dedup_ttl_s)
        marks = RedisWakeMarks(client, prefix, wake_mark_ttl_s(settings))
        events = RedisEvents(client, prefix, ttl_s=settings.dedup_ttl_s)
        dispatcher = CeleryDispatcher(celery_app, marks)
        sink = Client(store, dedup, settings, waker=dispatcher.wake, events=events, agents=agents)
        deps = SliceDeps(store, lease, dedup, dispatcher, events, agents, settings)
        return cls(settings, store, marks, dispatcher, sink, deps)


class LazyRuntime:
    """Builds the ``Runtime`` on the first task, in the worker process (after any fork)."""

    def __init__(self, celery_app: Celery, settings: Settings | None, agents: AgentSource) -> None:
        self._app = celery_app
        self._settings = settings
        self._agents = agents
        self._lock = threading.Lock()
        self._runtime: Runtime | None = None

    def get(self) -> Runtime:
        with self._lock:
            if self._runtime is None:
                settings = self._settings or Settings.from_env()
                agents = load_agents(self._agents, settings)
                self._runtime = Runtime.build(self._app, settings, agents)
            return self._runtime


def outcome_text(outcome: SliceOutcome) -> str:
    """The short string a slice task returns (and Flower shows)."""
    match outcome:
        case Idle():
            return "idle"
        case Waiting(call_ids=calls):
            return f"waiting:{len(calls)}"
        case Busy():
            return "busy"
        case Stale():
            return "stale"
        case Closed():
            return "closed"
        case Missing():
            return "missing"
        case Steered():
            return "steered"
        case Stalled(error=error):
            return f"stalled: {error}"[:200]
        case Failed(error=error, stalled=stalled):
            return f"{'stalled' if stalled else 'failed'}: {error}"[:200]


def _die(point: str) -> NoReturn:
    log.critical("crash point %s reached: killing worker process %d", point, os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(f"crash point {point}")  # unreachable: SIGKILL cannot be caught


def register_tasks(celery_app: Celery, runtime: Callable[[], Runtime]) -> None:
    """Register ``dormant.slice``, ``dormant.tool`` and ``dormant.sweep`` on ``celery_app``.

    Per-task options make them safe on an app whose defaults differ from dormant's: late
    acknowledgement, JSON arguments, no stored result.
    """
    options: dict[str, Any] = {
        "acks_late": True,
        "reject_on_worker_lost": True,
        "ignore_result": True,
        "serializer": "json",
        "shared": False,  # Celery's default would add these closures to every app made later
    }

    @celery_app.task(name=SLICE_TASK, bind=True, max_retries=None, **options)  # type: ignore[untyped-decorator]
    def slice_task(self: Task, thread_id: str) -> str:
        rt = runtime()
        try:
            rt.marks.clear(thread_id)  # before the slice loads the inbox: see RedisWakeMarks
        except redis.RedisError:
            log.warning("could not clear the wake mark of thread %s", thread_id, exc_info=True)
        try:
            outcome = run_slice(thread_id, rt.deps)
        except CrashPoint as crash:
            _die(crash.name)
        except LeaseLost:
            return "lease lost"
        if isinstance(outcome, Failed) and not outcome.stalled and outcome.retry_at is not None:
            countdown_s = (outcome.retry_at - datetime.now(UTC)).total_seconds()
            if countdown_s < rt.settings.visibility_timeout_s / 2:  # never a long ETA
                raise self.retry(countdown=max(0.0, countdown_s))
        return outcome_text(outcome)

    @celery_app.task(name=TOOL_TASK, **options)  # type: ignore[untyped-decorator]
    def tool_task(thread_id: str, call_id: str, outbox_id: int, action: str = "tool") -> str:
        rt = runtime()
        row = OutboxRow(outbox_id, thread_id, call_id, action, datetime.now(UTC))
        try:
            client = rt.client
            execute_outbox(
                row, rt.store, rt.deps.agents, client, client.callback_url, rt.deps.crash
            )
        except CrashPoint as crash:
            _die(crash.name)
        except NotFound as error:
            log.warning("outbox row %d not run: %s", outbox_id, error)
            return "missing"
        return "done"

    @celery_app.task(name=SWEEP_TASK, **options)  # type: ignore[untyped-decorator]
    def sweep_task() -> str:
        rt = runtime()
        now = datetime.now(UTC)
        settings = rt.settings
        # A tool task unacknowledged this long was redelivered by the broker if a worker
        # died; one still not run after that was lost (a flushed or failed-over broker).
        lost_after_s = settings.visibility_timeout_s + settings.outbox_grace_s
        woke = sweep_once(
            rt.store, rt.deps.lease, rt.dispatcher, now, settings.outbox_grace_s, lost_after_s
        )
        return "woke" if woke else "quiet"
