"""Thin Celery tasks: decode the arguments, call a plain function, map the outcome.

``dormant.slice(thread_id)`` runs ``run_slice`` and returns what the thread is doing now
(``idle``, ``waiting on run_build (call_...)``, ...: Flower shows it). A failed or stalled
slice raises ``SliceFailed`` once the store has recorded the failure, so Flower counts a
FAILURE with the reason; the message is acked like any ended task (the inbox rows stay in
SQL; the store's backoff, the sweeper or ``dormant retry`` drive the next try), and the
worker logs one line, no traceback: it is an expected outcome. A model failure with a short
backoff is retried by Celery with that countdown. ``dormant.tool(...)`` runs
``execute_outbox`` and returns what the run did (``done``, ``started; result pending via
callback``, ``error: ...``); a claim on its row that meets an unreachable database is
retried by Celery with backoff (``claim_backoff_s``), not dropped for the sweeper to find.
``dormant.sweep()`` runs one sweep turn without task events: beat sweeps itself now
(``celery/beat_sweep.py``) and sends no such task; it stays for a beat of an earlier
release during a rolling upgrade. A test crash point kills the worker
process with SIGKILL, so tests exercise real deaths: the unacknowledged task and the lease
are left behind.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from celery import Celery, Task

from dormant.agents import AgentRegistry, AgentSource, load_agents
from dormant.celery.beat_sweep import SweepParts, sweep_turn
from dormant.celery.config import PRUNE_TASK, SLICE_TASK, SWEEP_TASK, TOOL_TASK
from dormant.celery.dispatch import TRACE_HEADER, CeleryDispatcher
from dormant.client import Client
from dormant.errors import CrashPoint, LeaseLost, NotFound, SliceFailed
from dormant.ops.prune import prune
from dormant.runtime.close import Closing, close_idle_threads
from dormant.runtime.slice import (
    Busy,
    Closed,
    Deferred,
    Failed,
    Idle,
    Left,
    Missing,
    SliceDeps,
    SliceOutcome,
    Stale,
    Stalled,
    Steered,
    Waiting,
    run_slice,
)
from dormant.runtime.whereabouts import Whereabouts
from dormant.settings import Settings
from dormant.stores.base import OutboxRow
from dormant.stores.outages import unreachable_server
from dormant.stores.redis import (
    RedisDedup,
    RedisEvents,
    RedisLease,
    RedisSliceEnd,
    RedisSweepTurns,
    RedisWakeMarks,
    redis_client,
    wake_mark_ttl_s,
)
from dormant.stores.redis_limiter import RedisLimiter
from dormant.tools.claims import claim_run, renewed_claim
from dormant.tools.outcomes import (
    AlreadyAnswered,
    Answered,
    CancelHookRan,
    NotHere,
    Notified,
    Raised,
    Refused,
    Started,
    ToolOutcome,
)
from dormant.tools.runner import execute_outbox

if TYPE_CHECKING:
    # The SQL store (SQLAlchemy, the migrations' Alembic) is imported when the runtime is
    # built, on the worker's warm-up thread once it consumes, not before it starts.
    from dormant.celery.labels import LabelledSQLStore

__all__ = [
    "CLAIM_RETRIES",
    "LazyRuntime",
    "Runtime",
    "claim_backoff_s",
    "outcome_text",
    "register_tasks",
]

log = logging.getLogger("dormant.tasks")
_STALLED = "thread %s is stalled: %s (dormant retry re-drives it)"
_QUARANTINED = "thread %s goes on without a poison message: %s (dormant retry requeues it)"


@dataclass(frozen=True)
class Runtime:
    """What the tasks of one worker process share: the store, Redis, agents, dispatcher."""

    settings: Settings
    store: LabelledSQLStore
    marks: RedisWakeMarks
    dispatcher: CeleryDispatcher
    client: Client
    """The tools' sink: their results and events go in like any client's messages."""
    deps: SliceDeps
    sweep: SweepParts
    whereabouts: Whereabouts
    """This worker's card in the roster, and where the names it lacks run."""

    @classmethod
    def build(cls, celery_app: Celery, settings: Settings, agents: AgentRegistry) -> Runtime:
        from dormant.celery.labels import LabelledSQLStore, TaskLabels

        settings = settings.require_secret()  # tools' callback URLs are signed
        client = redis_client(settings)
        prefix = settings.key_prefix
        store = LabelledSQLStore(
            settings.database_url,
            TaskLabels(),
            table_prefix=settings.table_prefix,
            history_cache_bytes=settings.history_cache_bytes,
        )
        dedup = RedisDedup(client, prefix, settings.dedup_ttl_s)
        marks = RedisWakeMarks(client, prefix, wake_mark_ttl_s(settings))
        # Taking the lease clears the wake mark, before the slice loads the inbox (see
        # RedisWakeMarks), in the same round trip.
        lease = RedisLease(client, prefix, wake_marks=marks)
        events = RedisEvents(client, prefix, ttl_s=settings.dedup_ttl_s)
        dispatcher = CeleryDispatcher(celery_app, marks, labels=store.labels)
        sink = Client(store, dedup, settings, waker=dispatcher.wake, events=events, agents=agents)
        ending = RedisSliceEnd(client, lease, dedup, events)
        limiter = RedisLimiter(client, prefix)  # admission, and its counters
        whereabouts = Whereabouts(
            store,
            agents,
            announce_interval_s=settings.announce_interval_s,
            gone_after_s=settings.name_gone_after_s,
        )
        whereabouts.keep_announcing()
        deps = SliceDeps(
            store,
            lease,
            dedup,
            dispatcher,
            events,
            agents,
            settings,
            ending=ending,
            limiter=limiter,
            whereabouts=whereabouts,
            wakes_at_place_s=RETRY_COUNTDOWN_MAX_S,  # the slice task's retry, below
            wake_in=dispatcher.wake_in,  # the threads parked behind an admitted slice
        )
        closing = Closing(store, dispatcher, lease, events)
        sweep = SweepParts(
            settings,
            store,
            lease,
            dispatcher,
            RedisSweepTurns(client, prefix),
            functools.partial(close_idle_threads, closing, agents),
        )
        return cls(settings, store, marks, dispatcher, sink, deps, sweep, whereabouts)


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

    def built(self) -> Runtime | None:
        """The runtime if a task (or the warm-up) built it, without building one."""
        with self._lock:
            return self._runtime


def outcome_text(outcome: SliceOutcome) -> str:
    """What the thread is doing after the slice: the slice task's result in Flower."""
    match outcome:
        case Idle():
            return "idle"
        case Waiting(call_ids=calls, tools=tools):
            names = tools if len(tools) == len(calls) else ("?",) * len(calls)
            pairs = zip(names, calls, strict=True)
            waits = ", ".join(f"{name} ({call_id})" for name, call_id in pairs)
            return _short(f"waiting on {waits}")
        case Busy():
            return "busy: another slice holds the lease"
        case Stale():
            return "stale: another slice committed first; nothing written"
        case Closed():
            return "closed"
        case Missing():
            return "missing: no such thread"
        case Steered():
            return "steered: new user text restarts the turn"
        case Deferred(wait_s=wait_s):
            return f"deferred {wait_s:.1f} s: no model capacity (the sweeper re-wakes it)"
        case Left(why=why):
            return _short(f"left for another worker: {why}")
        case Stalled(error=error):
            return _short(f"stalled: {error}")
        case Failed(error=error, stalled=stalled):
            return _short(f"{'stalled' if stalled else 'failed'}: {error}")


def _tool_text(outcome: ToolOutcome) -> str:
    """What a tool task did: its result in Flower. A tool's error is not a task failure:
    it is the call's result, which the model reads; the task did its job."""
    match outcome:
        case Answered():
            return "done"
        case Started():
            return "started; result pending via callback"
        case Raised(error=error):
            return _short(f"error: {error}")
        case AlreadyAnswered():
            return "skipped: the call already has its result"
        case Refused(reason=reason):
            return _short(f"result dropped: {reason}")
        case CancelHookRan(hook=False):
            return "cancelled: no cancel hook"
        case CancelHookRan(error=None):
            return "cancelled: cancel hook ran"
        case CancelHookRan(error=error):
            return _short(f"error: cancel hook failed: {error}")
        case NotHere(why=why):
            return _short(f"left for another worker: {why}")
        case Notified(skipped=True):
            return "skipped: no approval to notify of"
        case Notified(error=None):
            return "notified: approval requested"
        case Notified(error=error):
            return _short(f"error: on_approval_requested failed: {error}")


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _die(point: str) -> NoReturn:
    log.critical("crash point %s reached: killing worker process %d", point, os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(f"crash point {point}")  # unreachable: SIGKILL cannot be caught


RETRY_COUNTDOWN_MAX_S = 60.0
"""A failed slice whose backoff ends within this long, or a slice deferred for model
capacity (``Deferred``) whose place comes within it, is retried by Celery at that time
(RETRY in Flower): a deferred thread asks again on time, not at the sweep after its place,
which would bring a sweep interval's places to the provider at once. A longer wait is left
to the sweeper, which wakes the thread once its ``retry_at`` passes, so no task waits long
in a worker's memory as an ETA. A deferral retried so is stored as not before a little
after its place (``SliceDeps.wakes_at_place_s``, ``PLACE_BACKSTOP_S``): the sweeper then
wakes it only if the retry's task was lost, not beside it."""


CLAIM_RETRIES = 8
"""How often a tool task whose claim met an unreachable database is retried (Celery's
retry, with ``claim_backoff_s``: about 75 s in all) before it fails; the sweeper then
sends the row again after ``tool_start_timeout_s``."""
_CLAIM_BACKOFF_S = (1.0, 15.0)
"""The first and the longest wait between two tries of a claim (doubling in between)."""
_CLAIM_LOST = "outbox row %d: %s is unreachable, so the claim is tried again in %.0f s"


def claim_backoff_s(retries: int) -> float:
    """The wait before the next try of a claim, after ``retries`` tries failed: 1, 2, 4,
    8, then 15 s. Short at first: a restarting PostgreSQL is back within seconds, and the
    call's thread waits on this tool."""
    first_s, longest_s = _CLAIM_BACKOFF_S
    return float(min(longest_s, first_s * 2**retries))


def register_tasks(celery_app: Celery, runtime: Callable[[], Runtime]) -> None:
    """Register ``dormant.slice``, ``dormant.tool`` and ``dormant.sweep`` on ``celery_app``.

    Per-task options make them safe on an app whose defaults differ from dormant's: late
    acknowledgement, an ack (not a requeue) when a task raises, JSON arguments, no stored
    result. ``SliceFailed`` is declared expected (``throws``): one INFO line, no traceback.
    """
    options: dict[str, Any] = {
        "acks_late": True,
        # A raised SliceFailed is acked even if the app sets task_acks_on_failure_or_timeout
        # to False: a requeue would rerun a recorded failure at once, forever.
        "acks_on_failure_or_timeout": True,
        "reject_on_worker_lost": True,
        "ignore_result": True,
        "serializer": "json",
        "shared": False,  # Celery's default would add these closures to every app made later
    }
    _quiet_sweep_logs()

    @celery_app.task(  # type: ignore[untyped-decorator]
        name=SLICE_TASK, bind=True, max_retries=None, throws=(SliceFailed,), **options
    )
    def slice_task(self: Task, thread_id: str) -> str:
        rt = runtime()
        # The Redis transport marks a task it restored from a dead worker (as RabbitMQ does).
        redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
        try:
            outcome = run_slice(thread_id, rt.deps, redelivered=redelivered)
        except CrashPoint as crash:
            _die(crash.name)
        except LeaseLost as lost:
            if lost.closed_reason is not None:  # the close revoked it: say so, not a race
                return _short(str(lost))
            return "lease lost: another slice took the thread"
        match outcome:
            case Failed(error=error, stalled=True):
                log.warning(_STALLED, thread_id, error)
                raise SliceFailed(thread_id, error, stalled=True)
            case Failed(error=error, quarantined=str()):
                log.warning(_QUARANTINED, thread_id, error)
                raise SliceFailed(thread_id, error, stalled=False)  # a FAILURE in Flower
            case Failed(error=error, retry_at=retry_at) if retry_at is not None:
                countdown_s = (retry_at - datetime.now(UTC)).total_seconds()
                if countdown_s <= RETRY_COUNTDOWN_MAX_S:  # never a long ETA: see its docstring
                    failure = SliceFailed(thread_id, error, stalled=False)
                    raise self.retry(countdown=max(0.0, countdown_s), exc=failure)
                note = f"{error} (the sweeper retries after {retry_at:%H:%M:%S} UTC)"
                raise SliceFailed(thread_id, note, stalled=False)
            case Failed(error=error):
                raise SliceFailed(thread_id, error, stalled=False)
            case Deferred(not_before=not_before, wait_s=wait_s):
                # asks again at its place, on time; the sweeper is its backstop (admission.py)
                if wait_s <= RETRY_COUNTDOWN_MAX_S:
                    countdown_s = (not_before - datetime.now(UTC)).total_seconds()
                    raise self.retry(countdown=max(0.0, countdown_s))
            case Stalled(error=error):
                raise SliceFailed(thread_id, error, stalled=True)
        return outcome_text(outcome)

    @celery_app.task(  # type: ignore[untyped-decorator]
        name=TOOL_TASK, bind=True, max_retries=CLAIM_RETRIES, **options
    )
    def tool_task(
        self: Task, thread_id: str, call_id: str, outbox_id: int, action: str = "tool"
    ) -> str:
        rt = runtime()
        # The writing slice's trace context rides in a header (``CeleryDispatcher``).
        trace = str(getattr(self.request, TRACE_HEADER, None) or "")
        row = OutboxRow(outbox_id, thread_id, call_id, action, datetime.now(UTC), trace=trace)
        ttl_s = rt.settings.tool_claim_ttl_s
        try:
            run = claim_run(rt.store, outbox_id, ttl_s)
        except Exception as error:
            if unreachable_server(error) is None:
                raise
            # Nothing ran: retrying is safe, and the claim still makes the tool run once.
            countdown_s = claim_backoff_s(self.request.retries)
            log.warning(_CLAIM_LOST, outbox_id, unreachable_server(error), countdown_s)
            raise self.retry(countdown=countdown_s, exc=error) from None
        if not run:
            return "skipped: the row ran or another run holds it"
        # The claim's heartbeat, not the broker, tells the sweeper this run is alive.
        with renewed_claim(rt.store, outbox_id, ttl_s):
            try:
                client = rt.client
                outcome = execute_outbox(
                    row,
                    rt.store,
                    rt.deps.agents,
                    client,
                    client.callback_url,
                    rt.deps.crash,
                    hand_in_timeout_s=rt.settings.hand_in_timeout_s,
                    run=run,
                    max_runs=rt.settings.tool_max_runs,
                    whereabouts=rt.whereabouts,
                    settings=rt.settings,
                )
            except CrashPoint as crash:
                _die(crash.name)
            except NotFound as error:
                log.warning("outbox row %d not run: %s", outbox_id, error)
                rt.store.mark_ran([outbox_id])
                return "missing"
        if isinstance(outcome, NotHere):  # the next sweep sends it to the queue again
            rt.store.unclaim_outbox(outbox_id)
        return _tool_text(outcome)

    # Sent by a beat of an earlier release only: no task events, no log line unless it
    # re-drove something.
    @celery_app.task(name=SWEEP_TASK, send_events=False, **options)  # type: ignore[untyped-decorator]
    def sweep_task() -> str:
        swept = sweep_turn(runtime().sweep, datetime.now(UTC))
        if swept is None:
            return "skipped: another sweep ran just now"
        if swept:
            log.info("sweep: %s", swept.summary())
        return swept.summary()

    @celery_app.task(name=PRUNE_TASK, **options)  # type: ignore[untyped-decorator]
    def prune_task() -> str:
        """Retention (opt-in, ``Settings.prune_older_than_s``): small batches, each its own
        short transaction, so it runs beside live traffic."""
        rt = runtime()
        settings = rt.settings
        if settings.prune_older_than_s <= 0:
            return "off: prune_older_than_s is not set"
        cutoff = datetime.now(UTC) - timedelta(seconds=settings.prune_older_than_s)
        counts = prune(rt.store, cutoff, batch=settings.prune_batch_size)
        summary = (
            f"pruned {counts.threads} threads, {counts.inbox} inbox rows, "
            f"{counts.outbox} outbox rows, {counts.timers} timers"
        )
        log.info("%s (older than %s)", summary, cutoff.isoformat(timespec="seconds"))
        return summary


class _QuietSweeps(logging.Filter):
    """Drops Celery's INFO lines about ``dormant.sweep`` (received, succeeded, sent by beat,
    expired) unless DEBUG is on; the sweep task logs at INFO itself when it re-drives work."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not _names_sweep(record.args):
            return True
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _names_sweep(args: object) -> bool:
    if isinstance(args, Mapping):
        return args.get("name") == SWEEP_TASK
    return isinstance(args, tuple) and SWEEP_TASK in args


_SWEEP_LOGGERS = (
    "celery.worker.strategy",
    "celery.app.trace",
    "celery.beat",
    "celery.worker.request",
)
"""Where Celery logs a task's receipt, its success, beat's 'Sending due task' and the
discarding of an expired task (a late sweep is dropped by design)."""


def _quiet_sweep_logs() -> None:
    for name in _SWEEP_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _QuietSweeps) for f in logger.filters):
            logger.addFilter(_QuietSweeps())
