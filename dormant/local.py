"""``LocalSystem``: the embedded runtime; one process, SQLite or memory, no servers.

Slices and tools run on a thread pool; a sweeper thread fires due timers, re-dispatches
outbox rows a crash left behind, re-wakes threads with unapplied inbox rows, closes
threads idle past their agent's limit and, with ``Settings.prune_older_than_s``, prunes.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from types import TracebackType

from dormant.agents import Agent, AgentRegistry
from dormant.base_client import BaseClient
from dormant.errors import DormantError, LeaseLost, ThreadsFailed
from dormant.messages import Chunk, Event
from dormant.ops.prune import prune
from dormant.runtime.admission import PLACE_WAKE_EARLY_S, next_deferred
from dormant.runtime.close import Closing, close_idle_threads
from dormant.runtime.idle import IdleReport, failed_threads
from dormant.runtime.memory_limiter import MemoryLimiter
from dormant.runtime.outcomes import Deferred
from dormant.runtime.slice import SliceDeps, run_slice
from dormant.runtime.sweeper import sweep_once
from dormant.runtime.whereabouts import Whereabouts
from dormant.settings import Settings
from dormant.stores.base import OutboxRow, Priority, Store
from dormant.stores.memory.live import MemoryLive
from dormant.stores.memory.store import MemoryStore
from dormant.stores.memory.sync import MemoryDedup, MemoryLease
from dormant.tools.claims import held_claim
from dormant.tools.mcp_session import close_mcp_sessions
from dormant.tools.outcomes import NotHere
from dormant.tools.runner import execute_outbox

__all__ = ["LocalSystem", "open_store"]

log = logging.getLogger("dormant.local")

Listener = Callable[[Event], None]


def open_store(
    database_url: str, table_prefix: str = "", history_cache_bytes: int | None = None
) -> Store:
    """A store for ``database_url``: ``memory://`` or an SQL URL (migrated to head), whose
    history cache holds ``history_cache_bytes`` (``Settings.history_cache_bytes``; None:
    the store's default)."""
    if database_url.startswith("memory:"):
        return MemoryStore()
    from dormant.stores.sql.items import ITEM_CACHE_BYTES
    from dormant.stores.sql.store import SQLStore, upgrade

    upgrade(database_url, table_prefix=table_prefix)
    cache = ITEM_CACHE_BYTES if history_cache_bytes is None else history_cache_bytes
    return SQLStore(database_url, table_prefix=table_prefix, history_cache_bytes=cache)


class _EventLog:
    """Keeps the most recent events (not chunks) of all threads and fans every event out
    to listeners. One bounded ring for the process: idle agents must cost nothing here."""

    def __init__(self, live: MemoryLive, max_events: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._events: deque[Event] = deque(maxlen=max_events)
        self.listeners: list[Listener] = []
        self.live = live

    def publish(self, event: Event) -> None:
        if not isinstance(event, Chunk):
            with self._lock:
                self._events.append(event)
        self.live.append(event)  # streams (``LocalSystem.stream``): nothing unless watched
        for listener in self.listeners:
            listener(event)

    def recent(self, thread_id: str) -> list[Event]:
        with self._lock:
            return [e for e in self._events if e.thread_id == thread_id]


class LocalSystem(BaseClient):
    """Agents in this process. Use as a context manager, or call ``close()``.

    Configuration comes from ``settings``, or else from ``Settings.from_env()`` (the
    ``DORMANT_*`` variables). ``database_url``, when given, overrides either: a SQLite URL
    (``"sqlite:///dormant.db"`` is the default), any SQLAlchemy URL, or ``"memory://"``.

    Callback URLs are signed with ``DORMANT_SECRET_KEY`` if set; otherwise a SQLite file
    gets a key generated once and kept beside it (``dormant.db.key``), so callbacks survive
    a restart; other databases (and a ``store`` passed in) get a key that dies with the
    process.
    """

    def __init__(
        self,
        agents: Iterable[Agent],
        database_url: str | None = None,
        *,
        settings: Settings | None = None,
        store: Store | None = None,
        workers: int = 4,
    ) -> None:
        settings = settings or Settings.from_env()
        if database_url is not None:
            settings = settings.with_(database_url=database_url)
        if store is None:
            store = open_store(
                settings.database_url, settings.table_prefix, settings.history_cache_bytes
            )
            settings = settings.with_local_secret()
        else:  # the caller's store: its database is not known here
            settings = settings.with_ephemeral_secret()
        self._opened_at = datetime.now(UTC)
        registry = agents if isinstance(agents, AgentRegistry) else AgentRegistry(agents)
        # The memory store's own dedup set is exact and costs nothing more; a separate
        # fast path beside it would only duplicate it (~220 bytes an id).
        dedup = store if isinstance(store, MemoryStore) else MemoryDedup()
        super().__init__(store, dedup, settings, registry)
        self.lease: MemoryLease = MemoryLease()
        self.live: MemoryLive = MemoryLive()
        self._log = _EventLog(self.live)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dormant")
        self._lock = threading.Lock()
        self._queued: dict[str, int] = {}
        """Threads with a slice waiting in ``_ready``, and the highest priority it has."""
        self._ready: list[tuple[int, int, Callable[..., None], object]] = []
        """(-priority, arrival, work, argument): what the pool runs next, most urgent first."""
        self._arrivals = itertools.count()
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)
        self._errors: list[BaseException] = []
        self._stop = threading.Event()
        self._nudge = threading.Event()
        self.slices_run = 0
        # A memory store is this process's alone: what it lacks, nobody has. A database
        # may be shared with other processes of other versions (a deploy's old and new).
        self.whereabouts = (
            None
            if isinstance(store, MemoryStore)
            else Whereabouts(
                store,
                registry,
                announce_interval_s=settings.announce_interval_s,
                gone_after_s=settings.name_gone_after_s,
            )
        )
        if self.whereabouts is not None:
            self.whereabouts.announce()
        self.deps = SliceDeps(
            store=self.store,
            lease=self.lease,
            dedup=self.dedup,
            dispatcher=self,
            events=self._log,
            agents=registry,
            settings=settings,
            limiter=MemoryLimiter(),
            whereabouts=self.whereabouts,
        )
        # Tool runs a previous process dispatched but never ran died with it: re-dispatch
        # them now, before this process dispatches anything of its own.
        self._sweep_once(grace_s=0.0, lost_after_s=0.0)
        self._sweeper = threading.Thread(
            target=self._sweep_loop, name="dormant-sweeper", daemon=True
        )
        self._sweeper.start()

    # lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> LocalSystem:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the sweeper, let running slices and tools finish, close the store and the
        process's MCP sessions (their servers stop; a later call starts them again)."""
        with self._lock:  # no work is queued after this (``_submit``)
            self._stop.set()
        self._nudge.set()
        self._sweeper.join()
        self._pool.shutdown(wait=True)
        if self.whereabouts is not None:
            self.whereabouts.withdraw()
        self.store.close()
        close_mcp_sessions()

    def on_event(self, listener: Listener) -> None:
        """Call ``listener`` with every live event (chunks included), on worker threads."""
        self._log.listeners.append(listener)

    def events(self, thread_id: str) -> list[Event]:
        return self._log.recent(thread_id)

    def publish(self, event: Event) -> None:
        self._log.publish(event)

    # the Dispatcher protocol -------------------------------------------------------------

    def wake(self, thread_id: str, priority: int) -> bool:
        with self._lock:
            if self._queued.get(thread_id, -1) >= priority:
                return False  # a queued slice at least as urgent drains everything first
            self._queued[thread_id] = priority
        if self._submit(self._run_slice, thread_id, priority):
            return True
        with self._lock:
            self._queued.pop(thread_id, None)
        self._left_at_close(thread_id)
        return False

    def dispatch(self, row: OutboxRow) -> None:
        if not self._submit(self._run_tool, row, Priority.BACKGROUND):
            self._left_at_close(row.thread_id)  # its outbox row stays unsent

    def _left_at_close(self, thread_id: str) -> None:
        """Work handed over as the system closes is stored, not lost, but nothing here runs
        it: no sweeper outlives ``close``."""
        durable = not self.settings.database_url.startswith("memory:")
        then = "; a LocalSystem opening the same database runs it" if durable else ""
        log.warning("thread %s has work left as its LocalSystem closes%s", thread_id, then)

    # running --------------------------------------------------------------------------

    def run_until_idle(
        self, timeout_s: float = 10.0, *, raise_on_failure: bool = True
    ) -> IdleReport:
        """Block until nothing is runnable: no slice or tool running, no due timer,
        no unapplied message. Future timers do not count. Raises ``TimeoutError``.

        A thread whose slice failed (a model error, say) also leaves nothing runnable: its
        messages wait, unconsumed, for a retry. So this then raises ``ThreadsFailed``
        naming each thread that failed while this system was open (stalled, or waiting to
        retry) and its last error; with ``raise_on_failure=False`` it returns that report.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with self._idle:
                while self._in_flight:
                    if not self._idle.wait(timeout=max(0.0, deadline - time.monotonic())):
                        raise TimeoutError(f"still busy after {timeout_s} s")
            self._raise_errors()
            if not self._sweep_once(grace_s=0.0):
                with self._lock:
                    busy = self._in_flight
                if not busy and not self._wait_for_deferred(deadline):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"still busy after {timeout_s} s")
        report = failed_threads(self.store, since=self._opened_at)
        if raise_on_failure and not report.ok:
            raise ThreadsFailed(report)
        return report

    def _wait_for_deferred(self, deadline: float) -> bool:
        """Sleep until the first thread deferred for model capacity may run again (its
        slice ended without consuming anything); False when none is deferred."""
        due = next_deferred(self.store, datetime.now(UTC))
        if due is None:
            return False
        wait_s = (due - datetime.now(UTC)).total_seconds()
        if time.monotonic() + wait_s > deadline:
            raise TimeoutError(f"threads still deferred for model capacity until {due:%X}")
        self._stop.wait(timeout=max(0.0, wait_s))
        return True

    def _run_slice(self, thread_id: str) -> None:
        with self._lock:
            self._queued.pop(thread_id, None)
        try:
            outcome = run_slice(thread_id, self.deps)
        except LeaseLost as lost:  # closed meanwhile (close_thread revoked the lease)
            log.info("slice of thread %s stopped: %s", thread_id, lost)
        else:
            if isinstance(outcome, Deferred) and outcome.wait_s <= 2 * PLACE_WAKE_EARLY_S:
                self._sweep_after(outcome.wait_s)
        with self._lock:
            self.slices_run += 1

    def _sweep_after(self, wait_s: float) -> None:
        """Sweep again when a deferred thread's place comes (as Celery retries its slice
        then), not at the next interval: the pace has room for it then, and not later."""
        timer = threading.Timer(wait_s + 0.001, self._nudge.set)
        timer.daemon = True
        timer.start()

    def _run_tool(self, row: OutboxRow) -> None:
        """Run the row under a claim in the store, as a Celery tool task does: a copy the
        sweeper sent again, here or from another process on the same database, finds the
        row claimed or ran and does nothing; a run this process died in is sent again
        once its claim lapses."""
        with held_claim(self.store, row.id, self.settings.tool_claim_ttl_s) as run:
            if run:
                outcome = execute_outbox(
                    row,
                    self.store,
                    self.deps.agents,
                    self,
                    self.callback_url,
                    self.deps.crash,
                    run=run,
                    max_runs=self.settings.tool_max_runs,
                    whereabouts=self.whereabouts,
                    settings=self.settings,
                )
        if run and isinstance(outcome, NotHere):  # the next sweep sends it again
            self.store.unclaim_outbox(row.id)

    def _submit(self, fn: Callable[..., None], arg: object, priority: int) -> bool:
        """Queue ``fn(arg)`` by priority: the pool thread that frees up next runs the most
        urgent queued work (user text before tool results), not the oldest. False once
        the system is closing: nothing queued (``close`` stops taking work under the same
        lock, so whatever was queued before still runs)."""
        with self._lock:
            if self._stop.is_set():
                return False
            self._in_flight += 1
            heapq.heappush(self._ready, (-priority, next(self._arrivals), fn, arg))
            future: Future[None] = self._pool.submit(self._run_next)
        future.add_done_callback(self._finished)
        return True

    def _run_next(self) -> None:
        with self._lock:
            _, _, fn, arg = heapq.heappop(self._ready)
        fn(arg)

    def _finished(self, future: Future[None]) -> None:
        error = future.exception()
        with self._idle:
            if error is not None:
                log.error("background task failed", exc_info=error)
                self._errors.append(error)
            self._in_flight -= 1
            self._idle.notify_all()

    def _raise_errors(self) -> None:
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            first = errors[0]
            if isinstance(first, DormantError):
                raise first
            raise RuntimeError(f"{len(errors)} background task(s) failed") from first

    # the sweeper ----------------------------------------------------------------------

    def _sweep_loop(self) -> None:
        prune_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self._sweep_once(grace_s=self.settings.outbox_grace_s)
                if self.whereabouts is not None:
                    self.whereabouts.announce_if_due()
                if self.settings.prune_older_than_s > 0 and time.monotonic() >= prune_at:
                    prune_at = time.monotonic() + self.settings.prune_interval_s
                    self._prune()
            except Exception:
                log.exception("sweep failed")
            self._nudge.wait(timeout=self._sleep_s())
            self._nudge.clear()

    def _prune(self) -> None:
        """Retention, as beat's ``dormant.prune`` does it (``Settings.prune_older_than_s``,
        every ``prune_interval_s``)."""
        cutoff = datetime.now(UTC) - timedelta(seconds=self.settings.prune_older_than_s)
        counts = prune(self.store, cutoff, batch=self.settings.prune_batch_size)
        if counts.total:
            log.info("pruned %d rows, %d of them threads", counts.total, counts.threads)

    def _sleep_s(self) -> float:
        """Until the next timer is due, at most one interval. A store that cannot say (a
        database briefly unreachable) gets the interval: the loop must outlive an outage,
        or nothing in this process would sweep again."""
        interval_s = self.settings.sweep_interval_s
        try:
            due = self.store.next_timer_due()
        except Exception:
            log.warning("next timer unknown, sweeping again in %.1f s", interval_s, exc_info=True)
            return interval_s
        if due is None:
            return interval_s
        return max(0.0, min(interval_s, (due - datetime.now(UTC)).total_seconds()))

    def _sweep_once(self, grace_s: float, lost_after_s: float | None = None) -> bool:
        lost_after_s = self.settings.visibility_timeout_s if lost_after_s is None else lost_after_s
        closing = Closing(self.store, dispatcher=self, lease=self.lease, events=self)
        close_idle = functools.partial(close_idle_threads, closing, self.deps.agents)
        swept = sweep_once(
            self.store, self.lease, self, datetime.now(UTC), grace_s, lost_after_s, close_idle
        )
        return bool(swept)
