"""The chaos run's processes (workers, beat) and the faults injected into them and the servers."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis

from chaos.agents import READY
from chaos.services import OwnPostgres, OwnRedis

__all__ = ["FAULT_KINDS", "Cluster"]

ROOT = Path(__file__).resolve().parent.parent
QUEUES = "dormant.interactive,dormant.background,dormant.tools"

WORKER_START_TIMEOUT_S = 600.0
"""Generous: on a shared two-core machine at load 11, three workers took over 180 s."""

FAULT_KINDS = (
    "worker SIGKILL",
    "beat SIGKILL",
    "redis FLUSHALL",
    "redis killed and restarted",
    "redis paused",
    "postgres crashed and restarted",
    "broker dropped a task",
)


@dataclass
class Cluster:
    """Workers and beat as subprocesses, and the faults that hit them and the servers."""

    env: dict[str, str]
    log_dir: Path
    redis_server: OwnRedis
    postgres: OwnPostgres
    stats: redis.Redis
    rng: random.Random
    workers: int
    concurrency: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    unexpected_exits: list[str] = field(default_factory=list)
    _serial: int = 0

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(self.workers):
            self._start_worker()
        self._start("beat", ["beat", "-l", "warning"])
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(self.stats.exists(READY + n) for n in self.procs if n != "beat"):
                return
            time.sleep(0.2)
        raise TimeoutError(f"the workers did not start within {WORKER_START_TIMEOUT_S:.0f} s")

    def _start_worker(self) -> str:
        self._serial += 1
        name = f"w{self._serial}"
        argv = ["worker", "-P", "threads", "-c", str(self.concurrency), "-Q", QUEUES]
        argv += ["-n", f"{name}@%h", "-l", "warning"]
        argv += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
        self._start(name, argv)
        return name

    def _start(self, name: str, argv: list[str]) -> None:
        with (self.log_dir / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "dormant.worker", *argv],
                env={**_base_env(), **self.env, "CHAOS_WORKER": name},
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def check_alive(self) -> None:
        """Note (and replace) any process that died without being killed by a fault."""
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                self.unexpected_exits.append(f"{name} exited with {proc.returncode}")
                del self.procs[name]
                if name == "beat":
                    self._start("beat", ["beat", "-l", "warning"])
                else:
                    self._start_worker()

    def inject(self, kind: str) -> bool:
        """Inject one fault of ``kind``; False if there was nothing to hit (an empty queue)."""
        self.check_alive()
        match kind:
            case "worker SIGKILL":
                names = [n for n in self.procs if n != "beat"]
                victim = self.rng.choice(names)
                self._kill(victim)
                self._start_worker()
            case "beat SIGKILL":
                self._kill("beat")
                self._start("beat", ["beat", "-l", "warning"])
            case "redis FLUSHALL":
                self.redis_server.flushall()
            case "redis killed and restarted":
                self.redis_server.restart()
            case "redis paused":
                # Longer than the lease TTL: leases expire while their holders cannot renew.
                lease_s = float(self.env["DORMANT_LEASE_TTL_S"])
                self.redis_server.pause()
                time.sleep(lease_s + self.rng.uniform(0.3, 1.0))
                self.redis_server.resume()
            case "postgres crashed and restarted":
                self.postgres.crash()
                time.sleep(self.rng.uniform(0.0, 0.5))
                self.postgres.start()
            case "broker dropped a task":
                if not self._drop_a_task():
                    return False  # nothing queued to drop: not counted
            case _:
                raise ValueError(f"unknown fault {kind!r}")
        self.faults[kind] += 1
        return True

    def _kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def _drop_a_task(self) -> bool:
        """Take one queued task message off a broker list, as a failing broker would lose it.

        On a quiet machine the lists are empty whenever they are looked at: Redis hands each
        published task straight to a worker blocked in BRPOP. If a first look finds nothing,
        the workers are paused (SIGSTOP, for half the lease TTL at most: no lease lapses), so
        that once their BRPOPs are served later tasks stay queued, and one is dropped. A
        quiet run may still find none."""
        if self._pop_a_task(within_s=0.5):
            return True
        workers = [proc for name, proc in self.procs.items() if name != "beat"]
        for proc in workers:
            proc.send_signal(signal.SIGSTOP)
        try:
            return self._pop_a_task(within_s=float(self.env["DORMANT_LEASE_TTL_S"]) / 2)
        finally:
            for proc in workers:
                proc.send_signal(signal.SIGCONT)

    def _pop_a_task(self, within_s: float) -> bool:
        client = self.redis_server.client()
        try:
            deadline = time.monotonic() + within_s
            while time.monotonic() < deadline:
                queues = [
                    k
                    for k in client.scan_iter(match=b"chaos:broker:dormant.*", count=1000)
                    if client.type(k) == b"list"
                ]
                self.rng.shuffle(queues)
                for queue in queues:
                    if client.rpop(queue) is not None:
                        return True
                time.sleep(0.05)
            return False
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
        self.procs.clear()


def _base_env() -> dict[str, str]:
    import os

    return dict(os.environ)
