"""``make chaos``: agents at work on real processes while a driver injects every fault.

Run ``python -m chaos.run --agents 500 --faults 245 --seed 7``. It starts its own
``redis-server`` (broker and dormant's Redis; the broker's clients reach it through
``chaos.proxy``), its own PostgreSQL cluster (``initdb`` under a temporary directory), a
stats Redis no fault touches, 3 workers and beat; launches the
agents (``chaos.agents``: deferred jobs, subscriptions with events, child threads, timers),
sends them more user text, answers their jobs and subscriptions, and meanwhile injects
faults of every kind in a seeded order (printed): worker and beat SIGKILLs (restarted),
Redis FLUSHALL, Redis killed and restarted, Redis paused longer than the lease TTL,
PostgreSQL crashed (``pg_ctl -m immediate``) and restarted, the broker losing a published
task. Then it waits for the system to quiesce, runs ``check_store`` and prints faults by
kind, messages sent, slices run, lost, duplicated, stuck, broken and the recovery time (from
the end of the last fault to quiescence); it exits 1 on any violation, or if the recovery
took longer than ``--recovery-bound-s`` (30 s).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from chaos.agents import CALLBACKS, SLICES, SUBSCRIPTIONS, TOOL_RUNS
from chaos.faults import DROP_WAIT_S, Cluster, fault_schedule
from chaos.proxy import BrokerProxy
from chaos.services import OwnPostgres, OwnRedis, available
from chaos.verdict import RECOVERY_BOUND_S, Verdict, judge

ROOT = Path(__file__).resolve().parent.parent
CALL_GIVE_UP_S = 120.0
"""How long the driver retries one client call through faults before it reports the error."""
SENDER_GRACE_S = 180.0
"""How long the senders may still take after the last fault before the run calls them hung:
longer than ``CALL_GIVE_UP_S``, so a call failing over and over is reported with its error,
and only a call that never returns (none since the broker got socket timeouts) as hung."""
SEND_SHARE = 0.9
"""The last user message goes when this share of the faults is in: the rest still hit its work."""
T = TypeVar("T")

CHAOS_SETTINGS = {
    "DORMANT_LEASE_TTL_S": "2",  # a dead slice's thread is re-driven 2 s later
    "DORMANT_FAILURE_BACKOFF_S": "0.2",  # a slice failed by a fault is retried at once...
    "DORMANT_STALL_AFTER_FAILURES": "1000",  # ...and faults never stall a thread
}
"""What the run shortens. The settings that re-send lost work (the sweep interval, the
outbox grace, the visibility timeout, the tool claim TTL, the tool start timeout, the
hand-in timeout) keep their shipped defaults: the run measures how soon that work comes
back (``Verdict.recovery_s``). The lease is short (30 s by default, renewed while its slice
runs) because chaos kills workers mid-slice by the dozen and each dead slice's thread waits
out its lease; the
failure policy, because a fault must never stall a thread. Each is documented in
docs/guarantees.md (the chaos run)."""


def retry(what: Callable[[], T], stop: threading.Event, give_up_s: float = CALL_GIVE_UP_S) -> T:
    """``what()``, tried again while servers are down (a fault), up to ``give_up_s``."""
    deadline = time.monotonic() + give_up_s
    while True:
        try:
            return what()
        except Exception:
            if time.monotonic() > deadline or stop.is_set():
                raise
            time.sleep(0.2)


@dataclass
class Pacer:
    """Lets the senders' k-th of n later messages go once ``SEND_SHARE * k / n`` of the
    faults have begun: messages keep flowing through the whole fault window (launches come
    first, at once), so faults hit slices of fresh user text until the end, whatever the
    faults' own durations (a Redis pause or a PostgreSQL restart takes seconds)."""

    faults: int
    _started: int = 0
    _finished: bool = False
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def fault_started(self) -> None:
        """A fault begins: its share of user text goes now, while it is injected. A drop
        waits for a task to be published, and this text (the wakes it sends, the slices and
        tools it starts) is what publishes one."""
        with self._changed:
            self._started += 1
            self._changed.notify_all()

    def finish(self) -> None:
        """The faults are over (or the run stops): every message may go."""
        with self._changed:
            self._finished = True
            self._changed.notify_all()

    def wait_turn(self, k: int, n: int, stop: threading.Event) -> None:
        due = SEND_SHARE * self.faults * k / max(1, n)
        with self._changed:
            while not (self._finished or stop.is_set() or self._started >= due):
                self._changed.wait(timeout=1.0)


@dataclass
class Driver:
    """Sends the agents' user text and answers their jobs and subscriptions, through faults."""

    env: dict[str, str]
    stats: redis.Redis
    rng: random.Random
    stop: threading.Event
    sent: dict[str, list[str]] = field(default_factory=dict)
    """thread id -> user message ids sent, in order."""
    messages: int = 0
    errors: list[str] = field(default_factory=list)

    _local: threading.local = field(default_factory=threading.local)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self) -> Any:
        """This thread's client (each driver thread has one, as separate processes would)."""
        from dormant.client import Client

        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = Client.from_env(self.env)
        return client

    def _attempt(self, what: str, action: Callable[[], object]) -> bool:
        """``action`` retried through faults; a final failure is a driver error, noted."""
        try:
            retry(action, self.stop)
            return True
        except Exception as error:
            text = "".join(traceback.format_exception(error))[-1200:]
            with self._lock:
                self.errors.append(f"{what}: {text}")
            return False

    def _counted(self, on_sent: Callable[[], None]) -> None:
        with self._lock:
            self.messages += 1
        on_sent()

    def launch_all(
        self, agents: int, on_sent: Callable[[], None], pool: ThreadPoolExecutor
    ) -> None:
        def launch(k: int) -> None:
            thread_id = f"thr_chaos{k:05d}"
            with self._lock:
                self.sent[thread_id] = ["u0"]
            ok = self._attempt(
                f"launch {thread_id}",
                lambda: self.client().launch("chaos", "u0", thread_id=thread_id, message_id="u0"),
            )
            if ok:
                self._counted(on_sent)

        list(pool.map(launch, range(agents)))

    def send_more(
        self, rounds: int, pacer: Pacer, on_sent: Callable[[], None], pool: ThreadPoolExecutor
    ) -> None:
        """The later rounds of user text, the k-th of n messages once the pacer lets it go."""
        from dormant.errors import DuplicateMessage

        threads = sorted(self.sent)
        total = rounds * len(threads)

        def send(thread_id: str, n: int, k: int) -> None:
            pacer.wait_turn(k, total, self.stop)
            if self.stop.is_set():
                return

            def once() -> None:
                # DuplicateMessage: stored by an earlier try whose answer was lost.
                with contextlib.suppress(DuplicateMessage):
                    self.client().send(thread_id, f"u{n}", message_id=f"u{n}")

            if self._attempt(f"send u{n} to {thread_id}", once):
                with self._lock:
                    self.sent[thread_id].append(f"u{n}")
                self._counted(on_sent)

        for n in range(1, rounds + 1):  # round by round: each thread's texts stay in order
            ks = range((n - 1) * len(threads) + 1, n * len(threads) + 1)
            list(pool.map(lambda t, k, n=n: send(t, n, k), threads, ks))

    def answer(self) -> None:
        """Deliver jobs' results and two events per subscription until the run stops."""
        from dormant.errors import DuplicateMessage, MessageRejected

        # Until the verdict is in: a tool re-run late (its claim lapsed) posts work again.
        while not self.stop.is_set():
            try:
                job = self.stats.lpop(CALLBACKS)
                sub = self.stats.lpop(SUBSCRIPTIONS)
            except redis.RedisError:
                job = sub = None
            if job is None and sub is None:
                time.sleep(0.1)
                continue
            if job is not None:
                url = str(job)
                call_id = url.rsplit("/", 2)[-1].split("?")[0]

                def deliver(url: str = url, call_id: str = call_id) -> None:
                    # Stored already, or answered by a re-run's second URL.
                    with contextlib.suppress(DuplicateMessage, MessageRejected):
                        self.client().deliver_callback(url, "job done", message_id=f"job:{call_id}")

                if self._attempt(f"deliver job {call_id}", deliver):
                    self._counted(lambda: None)
            if sub is not None:
                thread_id, call_id = str(sub).split()
                for k, associative in ((1, True), (2, False)):

                    def event(
                        t: str = thread_id, c: str = call_id, k: int = k, a: bool = associative
                    ) -> None:
                        with contextlib.suppress(DuplicateMessage, MessageRejected):
                            self.client().send_event(
                                t, c, f"event {k}", associative=a, message_id=f"ev{k}:{c}"
                            )

                    if self._attempt(f"event {k} on {call_id}", event):
                        self._counted(lambda: None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__)
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2, help="user messages after the first")
    parser.add_argument("--faults", type=int, default=245, help="faults in all (every kind)")
    parser.add_argument("--fault-gap-s", type=float, default=0.6)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--quiesce-timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--recovery-bound-s",
        type=float,
        default=RECOVERY_BOUND_S,
        help="fail if the system quiesces later than this after the last fault ended",
    )
    parser.add_argument(
        "--drop-wait-s",
        type=float,
        default=DROP_WAIT_S,
        help="how long a broker drop waits for a task to be published before it is missed",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the logs and data directory")
    args = parser.parse_args(argv)
    console = Console(stderr=False)
    # The driver's client logs each fault it rides out (with a traceback): not the report.
    logging.getLogger("dormant").setLevel(logging.ERROR)
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    console.print(f"chaos seed {seed} (replay with --seed {seed})")
    why = available()
    if why:
        console.print(f"[red]cannot run: {why}")
        return 2
    # SIGTERM (a test's timeout) stops the run through its cleanup: no server left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="dormant-chaos-"))
    work.chmod(0o755)  # the cluster's user (postgres, when run as root) must reach its files
    rng = random.Random(seed)
    own = OwnRedis(work / "redis")
    stats_server = OwnRedis(work / "stats")
    pg = OwnPostgres(work / "pg")
    proxy = BrokerProxy(work / "proxy", own.port, stats_server.url)
    cluster: Cluster | None = None
    try:
        own.start()
        stats_server.start()
        proxy.start()
        pg.init()
        pg.start()
        database_url = pg.create_database("dormant")
        from dormant.stores.sql.store import upgrade

        upgrade(database_url)
        env = {
            **CHAOS_SETTINGS,
            "DORMANT_DATABASE_URL": database_url,
            "DORMANT_BROKER_URL": proxy.url,  # the broker that drops a task when told
            "DORMANT_REDIS_URL": own.url,
            "DORMANT_KEY_PREFIX": "chaos",
            "DORMANT_BROKER_KEY_PREFIX": "chaos:broker:",
            "DORMANT_SECRET_KEY": secrets.token_hex(16),
            "DORMANT_AGENTS": "chaos.agents",
            "CHAOS_STATS_URL": stats_server.url,
            "PYTHONPATH": str(ROOT),
        }
        stats = redis.Redis.from_url(stats_server.url, decode_responses=True)
        cluster = Cluster(
            env,
            work / "logs",
            own,
            pg,
            proxy,
            stats,
            rng,
            args.workers,
            args.concurrency,
            args.drop_wait_s,
        )
        cluster.start()
        verdict = _run(args, console, env, stats, rng, cluster)
        console.print(verdict.report(seed))
        return 0 if verdict.ok else 1
    finally:
        if cluster is not None:
            cluster.stop()
        proxy.stop()
        own.stop()
        stats_server.stop()
        pg.stop()
        if args.keep:
            console.print(f"logs and data kept in {work}")
        else:
            pg.remove()
            subprocess.run(["rm", "-rf", str(work)], check=False)


def _run(
    args: argparse.Namespace,
    console: Console,
    env: dict[str, str],
    stats: redis.Redis,
    rng: random.Random,
    cluster: Cluster,
) -> Verdict:
    stop = threading.Event()
    senders_done = threading.Event()
    driver = Driver(env, stats, rng, stop)
    pacer = Pacer(args.faults)
    total_messages = args.agents * (1 + args.rounds)
    started = time.monotonic()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        sending = progress.add_task("user messages sent", total=total_messages)
        faulting = progress.add_task("faults injected", total=args.faults)

        def sent() -> None:
            progress.advance(sending)

        answerers = [threading.Thread(target=driver.answer, daemon=True) for _ in range(4)]
        for answerer in answerers:
            answerer.start()
        pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="sender")

        def send_all() -> None:
            try:
                driver.launch_all(args.agents, sent, pool)
                driver.send_more(args.rounds, pacer, sent, pool)
            except BaseException as error:
                driver.errors.append(f"sender: {error!r}")

        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        kinds = fault_schedule(args.faults, rng, sending=int(SEND_SHARE * args.faults))
        last_fault = time.monotonic()
        try:
            for kind in kinds:
                time.sleep(rng.uniform(0.5, 1.5) * args.fault_gap_s)
                pacer.fault_started()  # its share of user text goes as the fault begins
                if cluster.inject(kind):
                    last_fault = time.monotonic()
                    progress.advance(faulting)
        finally:
            pacer.finish()  # whatever is left may go now
        sender.join(timeout=SENDER_GRACE_S)
        if sender.is_alive():  # a client call that never returns: a finding, not a hang
            stacks = cluster.log_dir / "driver-stacks.txt"
            with stacks.open("w") as out:
                faulthandler.dump_traceback(out, all_threads=True)
            driver.errors.append(
                f"the senders were still blocked {SENDER_GRACE_S:.0f} s after the last fault "
                f"({driver.messages} messages sent); their stacks are in {stacks}"
            )
        quiet = progress.add_task("waiting to quiesce", total=None)
        senders_done.set()
        verdict = judge(
            env,
            driver.sent,
            cluster,
            timeout_s=args.quiesce_timeout_s,
            tick=lambda: progress.advance(quiet),
        )
        stop.set()
        for answerer in answerers:
            answerer.join(timeout=30)
        pool.shutdown(wait=False, cancel_futures=True)
    verdict.faults = Counter(cluster.faults)
    verdict.missed = Counter(cluster.missed)
    verdict.dropped = list(cluster.dropped)
    verdict.messages_sent = driver.messages
    verdict.slices = int(stats.get(SLICES) or 0)
    verdict.tool_runs = int(stats.get(TOOL_RUNS) or 0)
    verdict.recovery_s = verdict.quiesced_at - last_fault if verdict.quiesced_at else None
    verdict.recovery_bound_s = args.recovery_bound_s
    verdict.total_s = time.monotonic() - started
    verdict.driver_errors = list(driver.errors)
    verdict.worker_exits = cluster.unexpected_exits
    return verdict


if __name__ == "__main__":
    sys.exit(main())
