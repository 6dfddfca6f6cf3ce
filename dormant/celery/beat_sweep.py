"""The sweep runs in the beat process: ``sweep_once`` every ``sweep_interval_s`` on a thread
of beat itself, which publishes only the wakes and tool dispatches the sweep finds.

The sweep used to be a ``dormant.sweep`` task that beat sent to ``dormant.background``. That
put a message on a worker queue every interval, so a queue-length autoscaler (KEDA) never
saw an idle fleet and never let the workers reach zero; and the sweep waited behind
whatever the workers had queued, so a burst of thousands of slices held sweeps back for
minutes (they then expired, unrun). In beat, an idle deployment publishes nothing, and a
sweep runs on time whatever the queues hold.

``install`` connects ``start_on_beat`` to Celery's ``beat_init`` signal, which every beat
sends when it starts (``dormant beat``, ``celery -A dormant.worker beat``, a user's
``celery -A proj beat``, a worker's embedded ``-B``), whatever its scheduler: no schedule
entry, no custom scheduler. The ``dormant.sweep`` task stays registered, running the same
``sweep_turn``, for a beat of an earlier release during a rolling upgrade.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from celery.signals import beat_init
from celery.utils.imports import cwd_in_path

from dormant.agents import AgentRegistry, AgentSource, load_agents
from dormant.celery.dispatch import CeleryDispatcher
from dormant.errors import ConfigurationError
from dormant.runtime.close import Closing, close_idle_threads
from dormant.runtime.deps import Dispatcher
from dormant.runtime.sweeper import Swept, sweep_once
from dormant.settings import Settings
from dormant.stores.base import Lease, SweepStore
from dormant.stores.redis import (
    RedisEvents,
    RedisLease,
    RedisSweepTurns,
    RedisWakeMarks,
    redis_client,
    wake_mark_ttl_s,
)

__all__ = ["BeatSweeper", "SweepParts", "start_on_beat", "sweep_turn"]

log = logging.getLogger("dormant.sweep")


@dataclass(frozen=True)
class SweepParts:
    """What a sweep talks to: the store, the leases (to skip threads a slice holds), a
    dispatcher that sends through the app's broker and honours wake marks, and the turns
    that keep sweeps one at a time."""

    settings: Settings
    store: SweepStore
    lease: Lease
    dispatcher: Dispatcher
    turns: RedisSweepTurns
    close_idle: Callable[[datetime], int] | None = None
    """Closes threads idle past their agent's ``close_after_idle_s``; None where the agents
    are not known (their limits live on the ``Agent``)."""

    @classmethod
    def build(cls, celery_app: Celery, settings: Settings, agents: AgentSource) -> SweepParts:
        """The beat process's parts. Beat needs no signing key (a sweep only sends task
        names and ids), and the agents only for their idle limits: a beat that cannot load
        them (no ``DORMANT_AGENTS``) sweeps without closing idle threads, and says so."""
        from dormant.stores.sql.store import SQLStore  # SQLAlchemy: only where it sweeps

        client = redis_client(settings)
        prefix = settings.key_prefix
        marks = RedisWakeMarks(client, prefix, wake_mark_ttl_s(settings))
        store = SQLStore(settings.database_url, table_prefix=settings.table_prefix)
        dispatcher = CeleryDispatcher(celery_app, marks)
        lease = RedisLease(client, prefix)
        close_idle = None
        registry = _agents_or_none(agents, settings)
        if registry is not None and any(
            registry[name].close_after_idle_s is not None for name in registry
        ):
            events = RedisEvents(client, prefix, ttl_s=settings.dedup_ttl_s)
            closing = Closing(store, dispatcher, lease, events)
            close_idle = functools.partial(close_idle_threads, closing, registry)
        return cls(settings, store, lease, dispatcher, RedisSweepTurns(client, prefix), close_idle)


def _agents_or_none(agents: AgentSource, settings: Settings) -> AgentRegistry | None:
    """The agents, looked up from the current directory too, as ``dormant worker`` and
    Celery's ``-A`` do: ``dormant beat`` run beside ``myapp/`` finds ``myapp.agents``. A
    module that cannot be loaded (not found, or raising on import: a model's key read on a
    beat host without it) costs the idle closing, not the sweeps."""
    if agents is None and not settings.agents_module:
        log.info("beat closes no idle threads: no agents are configured (DORMANT_AGENTS)")
        return None
    try:
        with cwd_in_path():
            return load_agents(agents, settings)
    except ConfigurationError as error:  # configured, and wrong: said where beat logs show
        log.warning("beat closes no idle threads: %s", error)
        return None


def sweep_turn(parts: SweepParts, now: datetime) -> Swept | None:
    """One sweep, or None when another began less than half an interval ago (a second
    beat, a ``dormant.sweep`` task from an older beat): one sweep at a time."""
    settings = parts.settings
    if not parts.turns.take(settings.sweep_interval_s / 2):
        return None
    # A tool task no worker started this long after its dispatch was lost by the broker
    # (a flushed or restarted Redis); a started one that died is found by its claim.
    lost_after_s = min(
        settings.tool_start_timeout_s, settings.visibility_timeout_s + settings.outbox_grace_s
    )
    return sweep_once(
        parts.store,
        parts.lease,
        parts.dispatcher,
        now,
        settings.outbox_grace_s,
        lost_after_s,
        parts.close_idle,
    )


class BeatSweeper:
    """Sweeps every ``interval_s`` on a daemon thread, counted from each sweep's start (a
    sweep longer than the interval is followed by the next at once). A failed sweep (the
    database or Redis unreachable) is logged and the next one tries again; the parts are
    built on the thread, on first use, so beat starts even while they are down."""

    def __init__(self, parts: Callable[[], SweepParts], interval_s: float) -> None:
        self._make_parts = parts
        self._parts: SweepParts | None = None
        self.interval_s = interval_s

    def start(self) -> None:
        """Sweep now, then every interval, until the process exits (beat's end)."""
        threading.Thread(target=self._loop, name="dormant-sweep", daemon=True).start()

    def _loop(self) -> None:
        while True:
            next_at = time.monotonic() + self.interval_s
            self.sweep()
            time.sleep(max(0.0, next_at - time.monotonic()))

    def sweep(self) -> Swept | None:
        """One turn; None if it was another sweep's turn or it failed (logged)."""
        try:
            if self._parts is None:
                self._parts = self._make_parts()
            swept = sweep_turn(self._parts, datetime.now(UTC))
        except Exception as error:  # the next turn retries: nothing is lost meanwhile
            log.warning("sweep failed, retried in %.0f s: %r", self.interval_s, error)
            log.debug("the failed sweep's traceback", exc_info=True)
            return None
        if swept:
            log.info("sweep: %s", swept.summary())
        elif swept is not None:
            log.debug("sweep: %s", swept.summary())
        return swept


def start_on_beat(
    celery_app: Celery, settings: Callable[[], Settings], agents: AgentSource = None
) -> None:
    """Run a ``BeatSweeper`` in every beat of ``celery_app`` (``beat_init``). ``settings``
    is called when beat starts, so Django's settings are loaded by then."""

    def start(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not celery_app:
            return
        from dormant.cli.connect import check_schema

        try:
            resolved = settings()
            check_schema(resolved)  # a schema of another version: every sweep would fail
        except ConfigurationError as error:  # Celery would log it and beat run unswept
            raise SystemExit(f"error: {error}") from None
        sweeper = BeatSweeper(
            lambda: SweepParts.build(celery_app, resolved, agents), resolved.sweep_interval_s
        )
        sweeper.start()
        log.info("beat sweeps every %s s", resolved.sweep_interval_s)

    beat_init.connect(start, weak=False)
