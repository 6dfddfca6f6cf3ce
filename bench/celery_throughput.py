"""Slices per second through Celery, beside a no-op task on the same broker; wake-up latency.

    python bench/celery_throughput.py [--slices 2000] [--concurrency 8] [--latency-samples 200]

Needs the local PostgreSQL and Redis (``BENCH_POSTGRES_URL``, ``BENCH_REDIS_URL``). It
creates a throwaway database and Redis prefix, starts one ``celery worker -P threads`` on
this module (its agent runs a zero-latency ``SimulatedModel``), and prints:

- no-op tasks/s: ``bench.noop`` sent and run, the broker's and Celery's own ceiling;
- slices/s: ``dormant.slice`` tasks over threads with one queued message each (lease,
  load, one streamed 1,200-character completion, commit, events); the ratio of the two is
  the price of a durable slice over a bare task;
- wake-up latency p50/p99: ``Client.send`` returning to the model call starting, one
  message at a time on an idle worker.

The worker imports this module (``-A celery_throughput``); ``app`` is built on first access.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from dormant import Agent
from dormant.models import Completion, ModelRequest, SimulatedModel
from dormant.models.base import ChunkSink
from dormant.settings import Settings

HERE = Path(__file__).resolve().parent
POSTGRES_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL, decode_responses=True)


def _key(name: str) -> str:
    return f"{os.environ['DORMANT_KEY_PREFIX']}:bench:{name}"


class _Timed:
    """The simulated model, counting completions and stamping when each one starts."""

    name = "simulated"
    context_window = 200_000

    def __init__(self) -> None:
        self.inner = SimulatedModel(completion_chars=1200, chunk_chars=48)

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        started = time.time()
        completion = self.inner.complete(request, on_chunk)
        with _redis().pipeline(transaction=False) as pipe:
            pipe.hset(_key("started"), request.thread_id, repr(started))
            pipe.incr(_key("done"))
            pipe.execute()
        return completion


AGENTS = [Agent("bench", model=_Timed())]


@cache
def _app() -> Any:
    from dormant.worker import create_app

    app = create_app(Settings.from_env(), AGENTS)

    @app.task(name="bench.noop", shared=False, acks_late=True, ignore_result=True)  # type: ignore[untyped-decorator]
    def noop() -> None:
        _redis().incr(_key("done"))

    return app


def __getattr__(name: str) -> Any:
    if name == "app":
        return _app()
    raise AttributeError(name)


# The driver ---------------------------------------------------------------------------


@contextmanager
def _database() -> Any:
    admin = create_engine(
        make_url(POSTGRES_URL).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )
    name = f"dormant_bench_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                {"n": name},
            )
            conn.execute(text(f'DROP DATABASE "{name}"'))
        admin.dispose()


def _wait_done(expected: int, timeout_s: float = 300) -> float:
    """Poll the completion counter; the time the last one was seen."""
    deadline = time.monotonic() + timeout_s
    while (done := int(_redis().get(_key("done")) or 0)) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {done} of {expected} done")
        time.sleep(0.005)
    return time.monotonic()


def _measure(send: Any, count: int) -> float:
    """Tasks per second: ``count`` sends, then until the last one ran."""
    _redis().set(_key("done"), 0)
    started = time.monotonic()
    for i in range(count):
        send(i)
    return count / (_wait_done(count) - started)


def _run(args: argparse.Namespace, env: dict[str, str]) -> None:
    from dormant.client import Client
    from dormant.messages import UserMessage
    from dormant.stores.base import NewThread, Priority
    from dormant.worker import QUEUE_BACKGROUND

    client = Client.from_env(env)
    app = _app()
    argv = ["-A", "celery_throughput", "worker", "-P", "threads", "-c", str(args.concurrency)]
    argv += ["-Q", "dormant.interactive,dormant.background,dormant.tools", "-l", "warning"]
    argv += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", *argv], env={**os.environ, **env, "PYTHONPATH": str(HERE)}
    )
    try:
        # Warm-up: the worker connects and builds its runtime on the first tasks.
        _measure(lambda _i: app.send_task("bench.noop", queue=QUEUE_BACKGROUND), 50)
        noop_per_s = _measure(
            lambda _i: app.send_task("bench.noop", queue=QUEUE_BACKGROUND), args.slices
        )
        ids = [f"bench_{i}" for i in range(args.slices)]
        for thread_id in ids:
            client.store.create_thread(NewThread(id=thread_id, agent="bench"))
            client.store.enqueue(thread_id, f"m-{thread_id}", UserMessage(text="hi"), 8)
        slices_per_s = _measure(lambda i: client.wake(ids[i], Priority.INTERACTIVE), args.slices)

        latencies_ms = []
        for thread_id in ids[: args.latency_samples]:
            _redis().hdel(_key("started"), thread_id)
            sent = time.time()
            client.send(thread_id, "again")
            while (started := _redis().hget(_key("started"), thread_id)) is None:
                time.sleep(0.0005)
            latencies_ms.append((float(started) - sent) * 1000)
    finally:
        worker.kill()
        worker.wait()
        client.close()

    q = statistics.quantiles(latencies_ms, n=100)
    print(f"no-op Celery tasks:  {noop_per_s:8.0f} /s")
    print(
        f"dormant slices:      {slices_per_s:8.0f} /s  ({slices_per_s / noop_per_s:.2f} of no-op)"
    )
    print(f"wake-up latency:     p50 {q[49]:.1f} ms, p99 {q[98]:.1f} ms (send -> model call)")
    setup = f"1 worker, -P threads -c {args.concurrency}, {args.slices} tasks each"
    print(f"({setup}, {os.cpu_count()} cpus)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--latency-samples", type=int, default=200)
    args = parser.parse_args()
    prefix = f"bench{secrets.token_hex(4)}"
    from dormant.stores.sql import upgrade

    with _database() as database_url:
        upgrade(database_url)
        env = {
            "DORMANT_DATABASE_URL": database_url,
            "DORMANT_BROKER_URL": REDIS_URL,
            "DORMANT_REDIS_URL": REDIS_URL,
            "DORMANT_KEY_PREFIX": prefix,
            "DORMANT_BROKER_KEY_PREFIX": f"{prefix}:broker:",
            "DORMANT_SECRET_KEY": secrets.token_hex(16),
            "DORMANT_AGENTS": "celery_throughput",
        }
        os.environ.update(env)
        try:
            _run(args, env)
        finally:
            keys = list(_redis().scan_iter(match=f"{prefix}*", count=1000))
            for start in range(0, len(keys), 500):
                _redis().delete(*keys[start : start + 500])


if __name__ == "__main__":
    main()
