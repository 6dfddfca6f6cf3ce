"""A webhook burst against a rate-limited provider, without and with admission control.

    python bench/burst.py [--agents 500] [--rpm 100] [--tpm N] [--users 5] [--user-after-s 10]
        [--runs without,with,before] [--before-code DIR] [--limiter bucket|window]
        [--burst-priority background|interactive] [--out FILE]

The scenario of issue 23: one real ``dormant worker -c 8`` and ``dormant beat`` with default
settings, a local OpenAI-compatible server (``bench/burst_provider.py``) that allows
``--rpm`` requests and ``--tpm`` tokens a minute and answers 429 with the exact
``Retry-After`` past them; ``--users`` user-facing threads that already exist; then
``--agents`` threads launched at once as background (a webhook burst) and, ``--user-after-s``
after the last launch, user text for each user-facing thread. Each run has its own
PostgreSQL database (``dormant_bench_<hex>``, dropped after) and Redis key prefix (db
``--redis-db``).

Reported for each run, side by side: wall time of the burst (launch to the last agent's
answer committed) against the limit's ideal, 429s the server answered, worker slot time
spent asleep in retry backoff (the workers' admission counter ``asleep_s``),
utilisation of the limit (requests served / (RPM x minutes)), user text sent → the server's
first chunk for it and → its answer committed (p50), the longest gap between two sweeps
(beat stamps each sweep in Redis; the driver polls it), whether every agent finished, and
what the burst cost the worker: slice tasks run (a Celery retry is a task of its own), and
per model call (requests the server received), Celery retries of slice tasks, deferrals
that called no model (slices that ended for want of capacity, less the 429s), and launches
parked in their queue without a slice (the admission counter ``parked``, issue 35).

``--runs before`` is the "with" run on other code: ``--before-code DIR`` is a directory
holding an earlier tree's ``dormant`` package (``git archive <commit> dormant | tar -x -C
DIR``), put first on the worker's and beat's ``PYTHONPATH``, so a change is measured
beside its baseline in the same run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis
from burst_app import COUNTERS, MODEL
from burst_provider import RateLimitedProvider
from burst_report import report
from celery_bench import HERE, database
from rich.console import Console
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from dormant.client import Client

console = Console(width=130)
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Scenario:
    agents: int
    rpm: float
    tpm: float
    users: int
    user_after_s: float
    concurrency: int
    burst_priority: str
    limiter: str
    burst_s: float
    reply_words: int
    chunk_s: float


def admission_env(scenario: Scenario, provider_url: str) -> dict[str, str]:
    """The settings that switch admission control on for the "with" run: the provider's
    limits for the bench's model, as ``DORMANT_RATE_LIMITS`` (JSON). The one place that
    knows their shape."""
    limits = {"rpm": scenario.rpm, "tpm": scenario.tpm, "concurrency": scenario.concurrency}
    return {"DORMANT_RATE_LIMITS": json.dumps({f"openai:{MODEL}": limits})}


class SweepWatch:
    """Polls the key each sweep stamps with its start (``RedisSweepTurns``, held for half
    an interval) and keeps every distinct stamp: the sweeps that ran, to the poll's
    resolution."""

    def __init__(self, client: redis.Redis, key: str, poll_s: float = 0.1) -> None:
        self.starts_ms: set[int] = set()
        self._client, self._key, self._poll_s = client, key, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._poll_s):
            with_value = self._client.get(self._key)
            if with_value is not None:
                self.starts_ms.add(int(with_value))

    def longest_gap_s(self, from_s: float, to_s: float) -> float:
        """The longest time in [from_s, to_s] with no sweep starting."""
        inside = sorted(s / 1000 for s in self.starts_ms if from_s * 1000 <= s <= to_s * 1000)
        edges = [from_s, *inside, to_s]
        return max(b - a for a, b in itertools.pairwise(edges))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Deployment:
    """One run's worker, beat, client and counters, on its own database and prefix."""

    def __init__(
        self, env: dict[str, str], redis_url: str, log: Path, code: Path | None = None
    ) -> None:
        self.env = env
        self.code = code
        self.client = Client.from_env(env)
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.prefix = env["DORMANT_KEY_PREFIX"]
        url = make_url(env["DORMANT_DATABASE_URL"]).set(drivername="postgresql+psycopg")
        self.engine: Engine = create_engine(url)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log = log

    def start(self, *argv: str) -> None:
        path = str(HERE) if self.code is None else f"{self.code}{os.pathsep}{HERE}"
        env = {**os.environ, **self.env, "PYTHONPATH": path}
        with self.log.open("ab") as log:
            self.procs.append(
                subprocess.Popen([str(BIN / "dormant"), *argv], env=env, stdout=log, stderr=log)
            )

    def check(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args} exited with {proc.returncode}: see {self.log}")

    def admission(self, name: str) -> float:
        """One of the workers' admission counters (``stores/redis_limiter.py``): kept with
        and without limits, so both runs count their slots' seconds asleep in backoff."""
        return float(self.redis.hget(f"{self.prefix}:admission", name) or 0)

    def tasks(self, name: str) -> int:
        """One of the bench's counters of slice tasks (``burst_app.py``)."""
        return int(self.redis.hget(f"{self.prefix}:{COUNTERS}", name) or 0)

    def answered(self, prefix: str, turns: int = 1) -> dict[str, float]:
        """Threads whose id starts with ``prefix`` that have ``turns`` assistant turns, and
        when each last committed (``threads.updated_at``, as epoch seconds)."""
        query = text(
            "SELECT t.id, extract(epoch FROM t.updated_at) FROM threads t WHERE t.id LIKE :p "
            "AND (SELECT count(*) FROM items i WHERE i.thread_id = t.id "
            "AND i.kind = 'assistant') >= :n"
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query, {"p": prefix + "%", "n": turns}).all()
        return {row[0]: float(row[1]) for row in rows}

    def stalled(self, prefix: str) -> dict[str, float]:
        """Stalled threads whose id starts with ``prefix``, and when they stalled."""
        query = text(
            "SELECT id, extract(epoch FROM updated_at) FROM threads "
            "WHERE id LIKE :p AND status = 'stalled'"
        )
        with self.engine.connect() as conn:
            return {row[0]: float(row[1]) for row in conn.execute(query, {"p": prefix + "%"})}

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.client.close()
        self.engine.dispose()
        keys = list(self.redis.scan_iter(match=f"{self.prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            self.redis.delete(*keys[start : start + 500])
        self.redis.close()


def wait_for(what: str, done: Any, deployment: Deployment, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := done()):
        deployment.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(0.25)
    return value


@contextmanager
def deployment(
    args: argparse.Namespace,
    scenario: Scenario,
    admission: bool,
    provider_url: str,
    code: Path | None = None,
) -> Iterator[Deployment]:
    redis_url = f"{args.redis_host}/{args.redis_db}"
    prefix = f"dormant_burst_{secrets.token_hex(4)}"
    with database(args.postgres_url) as database_url:
        env = {
            "DORMANT_DATABASE_URL": database_url,
            "DORMANT_BROKER_URL": redis_url,
            "DORMANT_REDIS_URL": redis_url,
            "DORMANT_KEY_PREFIX": prefix,
            "DORMANT_BROKER_KEY_PREFIX": f"{prefix}:broker:",
            "DORMANT_SECRET_KEY": secrets.token_hex(16),
            "DORMANT_AGENTS": "burst_app",
            "BURST_PROVIDER_URL": provider_url,
            "OPENAI_API_KEY": "bench",
        }
        if admission:
            env |= admission_env(scenario, provider_url)
        log = HERE / "results" / "burst-workers.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        d = Deployment(env, redis_url, log, code)
        try:
            yield d
        finally:
            d.close()


def run(
    args: argparse.Namespace, scenario: Scenario, admission: bool, code: Path | None = None
) -> dict[str, Any]:
    provider = RateLimitedProvider(
        scenario.rpm,
        scenario.tpm,
        limiter=scenario.limiter,
        burst_s=scenario.burst_s,
        reply_words=scenario.reply_words,
        chunk_s=scenario.chunk_s,
    )
    try:
        with deployment(args, scenario, admission, provider.base_url, code) as d:
            return _run(d, scenario, provider)
    finally:
        provider.close()


def _run(d: Deployment, s: Scenario, provider: RateLimitedProvider) -> dict[str, Any]:
    d.start("worker", "--agents", "burst_app", "-c", str(s.concurrency), "-l", "warning")
    d.start("beat", "-l", "warning")
    sweeps = SweepWatch(d.redis, f"{d.prefix}:sweep")
    users = [
        d.client.launch("burst", f"user {n}: hello", thread_id=f"user_{n}") for n in range(s.users)
    ]
    wait_for(
        "the user-facing threads' first answers",
        lambda: len(d.answered("user_")) == s.users,
        d,
        300,
    )
    asleep_before = d.admission("asleep_s")
    deferred_before = d.admission("deferred")
    parked_before = d.admission("parked")
    limited_before = d.admission("rate_limited")
    tasks_before = d.tasks("slice_tasks")
    retries_before = d.tasks("retries")

    sent_at: dict[str, float] = {}
    texts: dict[str, str] = {}
    started = time.time()
    for n in range(s.agents):
        d.client.launch(
            "burst", f"webhook event {n}", thread_id=f"burst_{n}", priority=s.burst_priority
        )
    launched_s = time.time() - started
    # "At once": the user text comes user_after_s after the last launch, however long a
    # busy machine took to make the launches.
    time.sleep(s.user_after_s)
    for thread_id in users:
        texts[thread_id] = f"{thread_id}: where is my order? ({secrets.token_hex(4)})"
        sent_at[thread_id] = time.time()
        d.client.send(thread_id, texts[thread_id])

    ideal_s = s.agents / s.rpm * 60
    timeout_s = max(300.0, 5 * ideal_s)
    deadline = time.monotonic() + timeout_s
    finished: dict[str, float] = {}
    user_done: dict[str, float] = {}
    stalled: dict[str, float] = {}
    timed_out = True
    while time.monotonic() < deadline:
        d.check()
        finished = d.answered("burst_")
        user_done = d.answered("user_", turns=2)
        stalled = d.stalled("burst_") | d.stalled("user_")
        if len(finished) + len(user_done) + len(stalled) >= s.agents + s.users:
            timed_out = False
            break
        time.sleep(0.5)
    # The burst ends when its last thread answered or stalled (or at the deadline).
    ended = time.time() if timed_out else max([*finished.values(), *stalled.values()])
    sweeps.stop()

    wall_s = ended - started
    window = [r for r in provider.served if started <= r.at_s <= ended]
    served = sum(1 for r in window if r.status == 200)
    first_token = [
        provider.first_chunk_at[texts[t]] - sent_at[t]
        for t in users
        if texts[t] in provider.first_chunk_at
    ]
    committed = [user_done[t] - sent_at[t] for t in users if t in user_done]
    asleep_s = d.admission("asleep_s") - asleep_before
    deferred = d.admission("deferred") - deferred_before
    slice_tasks = d.tasks("slice_tasks") - tasks_before
    return {
        "wall_s": wall_s,
        "ideal_s": ideal_s,
        "launch_s": launched_s,
        "requests": len(window),
        "served": served,
        "answered_429": len(window) - served,
        "deferred": deferred,
        "deferred_no_model": deferred - (d.admission("rate_limited") - limited_before),
        "parked": d.admission("parked") - parked_before,
        "slice_tasks": slice_tasks,
        "slice_tasks_per_call": slice_tasks / len(window) if window else None,
        "retries": d.tasks("retries") - retries_before,
        "asleep_s": asleep_s,
        "asleep_share": asleep_s / (s.concurrency * wall_s),
        "utilisation": served / (s.rpm * wall_s / 60),
        "first_token_s": first_token,
        "first_token_p50_s": statistics.median(first_token) if first_token else None,
        "committed_s": committed,
        "committed_p50_s": statistics.median(committed) if committed else None,
        "longest_sweep_gap_s": sweeps.longest_gap_s(started, ended),
        "sweeps": len([x for x in sweeps.starts_ms if started * 1000 <= x <= ended * 1000]),
        "finished": len(finished),
        "stalled": len([t for t in stalled if t.startswith("burst_")]),
        "users_stalled": len([t for t in stalled if t.startswith("user_")]),
        "timed_out": timed_out,
        "all_finished": len(finished) == s.agents,
        "per_minute": _per_minute(window, started),
    }


def _per_minute(window: list[Any], started: float) -> list[dict[str, int]]:
    """Requests served and refused in each minute since the burst began."""
    minutes: dict[int, dict[str, int]] = {}
    for r in window:
        slot = minutes.setdefault(int((r.at_s - started) // 60), {"served": 0, "refused": 0})
        slot["served" if r.status == 200 else "refused"] += 1
    return [minutes[m] for m in sorted(minutes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--rpm", type=float, default=100)
    parser.add_argument("--tpm", type=float, help="tokens a minute (default: 400 x RPM)")
    parser.add_argument("--users", type=int, default=5)
    parser.add_argument("--user-after-s", type=float, default=10.0)
    parser.add_argument("--concurrency", "-c", type=int, default=8)
    parser.add_argument(
        "--burst-priority", choices=("background", "interactive"), default="background"
    )
    parser.add_argument(
        "--limiter",
        choices=("bucket", "window"),
        default="bucket",
        help="the provider's limits: refilled continuously, or any 60 s (see burst_provider.py)",
    )
    parser.add_argument(
        "--burst-s",
        type=float,
        default=1.0,
        help="the provider's buckets hold this many seconds' worth",
    )
    parser.add_argument("--reply-words", type=int, default=40)
    parser.add_argument("--chunk-s", type=float, default=0.02)
    parser.add_argument("--runs", default="without,with")
    parser.add_argument(
        "--before-code",
        type=Path,
        help="a directory holding an earlier tree's dormant package, for --runs before",
    )
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-host", default="redis://127.0.0.1:6379")
    parser.add_argument("--redis-db", type=int, default=12)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "burst.json")
    args = parser.parse_args()
    if args.redis_db == 0:
        parser.error("the bench never uses Redis db 0")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scenario = Scenario(
        agents=args.agents,
        rpm=args.rpm,
        tpm=args.tpm if args.tpm is not None else 400 * args.rpm,
        users=args.users,
        user_after_s=args.user_after_s,
        concurrency=args.concurrency,
        burst_priority=args.burst_priority,
        limiter=args.limiter,
        burst_s=args.burst_s,
        reply_words=args.reply_words,
        chunk_s=args.chunk_s,
    )
    results: dict[str, Any] = {
        "scenario": asdict(scenario),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "runs": {},
    }
    for name in args.runs.split(","):
        if name not in ("without", "with", "before"):
            parser.error(f"--runs takes without, with and before, not {name!r}")
        if name == "before" and (args.before_code is None or not args.before_code.is_dir()):
            parser.error("--runs before needs --before-code DIR (an earlier tree's package)")
        code = args.before_code.resolve() if name == "before" else None
        with console.status(f"{name}: {scenario.agents} agents"):
            results["runs"][name] = run(args, scenario, admission=name != "without", code=code)
        results["runs"][name]["code"] = str(code) if code else "this tree"
    results["load_after"] = os.getloadavg()
    report(scenario, results["runs"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    console.print(f"raw figures: {args.out}")


if __name__ == "__main__":
    main()
