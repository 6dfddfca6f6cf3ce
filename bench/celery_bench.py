"""The harness of ``bench/celery_throughput.py``: its database, its workers, its counters.

``Bench`` holds one run's settings, a ``Client``, the Redis keys and the worker processes
it started. A worker is ``python bench/celery_worker.py`` (``celery_app.app`` run by
``dormant.celery.worker_process.start_worker``, as ``dormant worker`` runs its app) or, with
``worker_cli="celery"``, ``celery -A celery_app worker``: the same worker, started through
Celery's command line (which also imports Flower and click_repl when they are installed).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

HERE = Path(__file__).resolve().parent
QUEUES = "dormant.interactive,dormant.background,dormant.tools"


class Bench:
    """One run: the settings, a client, the Redis keys, and the workers it started."""

    def __init__(self, env: dict[str, str], redis_url: str, worker_cli: str = "dormant") -> None:
        from dormant.client import Client
        from dormant.settings import Settings

        self.env = env
        self.settings = Settings.from_env(env)
        self.client = Client.from_settings(self.settings)
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.engine: Engine = create_engine(
            make_url(self.settings.database_url).set(drivername="postgresql+psycopg")
        )
        self.prefix = self.settings.key_prefix
        self.workers: list[subprocess.Popen[bytes]] = []
        self.producer: Any = None
        self.log = HERE / "results" / "celery-workers.log"
        self.worker_cli = worker_cli

    def key(self, name: str) -> str:
        return f"{self.prefix}:bench:{name}"

    # workers ----------------------------------------------------------------------------

    def start_workers(self, count: int, concurrency: int = 8) -> None:
        for _ in range(count):
            name = f"bench{len(self.workers)}-{self.prefix}@%h"
            if self.worker_cli == "celery":
                argv = [sys.executable, "-m", "celery", "-A", "celery_app", "worker"]
                argv += ["-P", "threads", "-c", str(concurrency), "-n", name, "-l", "warning"]
                argv += ["-Q", QUEUES, "--without-heartbeat", "--without-gossip"]
                argv += ["--without-mingle"]
            else:
                argv = [sys.executable, str(HERE / "celery_worker.py"), str(concurrency), name]
            # A PYTHONPATH of the caller's comes after bench/ (another tree's package, to
            # measure it beside this one: docs/benchmarks.md).
            path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
            env = {**os.environ, **self.env, "PYTHONPATH": path}
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log, "ab") as log:
                worker = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            self.workers.append(worker)

    def ready(self, tasks: int = 20) -> None:
        """Wait until the workers run tasks and are done starting: no measurement includes
        a worker's start (a dormant worker builds its runtime on a thread once it is ready,
        about a second of CPU that would otherwise land on the first phase's baseline)."""
        self.redis.set(self.key("done"), 0)
        for _ in range(tasks):
            self.noop()
        self.wait(self.done, tasks, timeout_s=300)
        self.settle()

    def settle(self, idle_share: float = 0.05, every_s: float = 0.5, timeout_s: float = 60) -> None:
        """Wait until the workers use under ``idle_share`` of a core over ``every_s``."""
        deadline = time.monotonic() + timeout_s
        before = self.workers_cpu_s()
        while time.monotonic() < deadline:
            time.sleep(every_s)
            now = self.workers_cpu_s()
            if now - before < idle_share * every_s * len(self.workers):
                return
            before = now
        raise TimeoutError(f"the workers still busy after {timeout_s} s with nothing queued")

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.kill()
            worker.wait()
        self.workers = []

    def workers_cpu_s(self) -> float:
        """CPU seconds (user and system) the running workers have used since they started."""
        total = 0
        for worker in self.workers:
            with open(f"/proc/{worker.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def check_workers(self) -> None:
        for worker in self.workers:
            if worker.poll() is not None:
                raise RuntimeError(
                    f"worker {worker.pid} exited with {worker.returncode}: see {self.log}"
                )

    def drain(self, timeout_s: float = 900) -> None:
        """Wait until the broker's queues are empty: no phase inherits another's backlog."""
        pattern = f"{self.settings.broker_key_prefix}dormant.*"

        def queued() -> int:
            keys = [k for k in self.redis.scan_iter(match=pattern) if self.redis.type(k) == "list"]
            return sum(self.redis.llen(k) for k in keys)

        deadline = time.monotonic() + timeout_s
        while queued():
            self.check_workers()
            if time.monotonic() > deadline:
                raise TimeoutError(f"broker queues not empty after {timeout_s} s")
            time.sleep(0.05)

    # counting ---------------------------------------------------------------------------

    def noop(self, sample: str = "") -> None:
        from dormant.worker import QUEUE_BACKGROUND

        self._app().send_task("bench.noop", args=[sample], queue=QUEUE_BACKGROUND)

    def _app(self) -> Any:
        """A producer on the same broker and configuration as the client's dispatcher."""
        if self.producer is None:
            from celery import Celery

            from dormant.worker import celery_config

            self.producer = Celery("bench", set_as_current=False)
            self.producer.conf.update(celery_config(self.settings))
        return self.producer

    def done(self) -> int:
        return int(self.redis.get(self.key("done")) or 0)

    def committed(self, prefix: str) -> int:
        """Assistant turns committed by threads whose id starts with ``prefix``."""
        query = "SELECT count(*) FROM items WHERE kind = 'assistant' AND thread_id LIKE :p"
        with self.engine.connect() as conn:
            return int(conn.execute(text(query), {"p": prefix + "%"}).scalar_one())

    def wait(self, count: Callable[[], int], expected: int, timeout_s: float = 900) -> float:
        """Poll ``count`` until it reaches ``expected``; the monotonic time it was seen."""
        deadline = time.monotonic() + timeout_s
        while (seen := count()) < expected:
            self.check_workers()
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {seen} of {expected} after {timeout_s} s")
            time.sleep(0.01)
        return time.monotonic()

    def close(self) -> None:
        self.stop_workers()
        self.client.close()
        self.engine.dispose()
        keys = list(self.redis.scan_iter(match=f"{self.prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            self.redis.delete(*keys[start : start + 500])
        self.redis.close()


@contextmanager
def database(admin_url: str) -> Iterator[str]:
    from dormant.stores.sql.store import upgrade

    admin = create_engine(
        make_url(admin_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )
    name = f"dormant_bench_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                {"n": name},
            )
            conn.execute(text(f'DROP DATABASE "{name}"'))
        admin.dispose()
