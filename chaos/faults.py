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
from chaos.proxy import DROPPABLE, BrokerProxy
from chaos.services import OwnPostgres, OwnRedis
from dormant.settings import Settings

__all__ = ["DROP", "DROP_WAIT_S", "FAULT_KINDS", "Cluster", "fault_schedule"]

ROOT = Path(__file__).resolve().parent.parent
QUEUES = "dormant.interactive,dormant.background,dormant.tools"

WORKER_START_TIMEOUT_S = 600.0
"""Generous: on a shared two-core machine at load 11, three workers took over 180 s."""

DROP = "broker dropped a task"
DROP_WAIT_S = 15.0
"""How long a drop waits for a task to be published. While user text is being sent (drops
come only then) one is published within moments; a drop that waits this long found a system
that publishes nothing, and is reported as missed. (60 s made a run of 18 misses last 18
minutes longer, to learn nothing more.) ``--drop-wait-s`` sets it: the bounded run in
``make unit``, which requires every drop to land, waits 60 s.)"""

FAULT_KINDS = (
    "worker SIGKILL",
    "beat SIGKILL",
    "redis FLUSHALL",
    "redis killed and restarted",
    "redis paused",
    "postgres crashed and restarted",
    DROP,
)


def fault_schedule(faults: int, rng: random.Random, sending: int) -> list[str]:
    """``faults`` kinds in a seeded order, each kind as often as the others (give or take
    one), with drops only among the first ``sending``, while user text still goes out: a
    drop waits for a task to be published, and the user text let go as each fault starts
    (``Pacer``) makes sure one is."""
    kinds = [FAULT_KINDS[k % len(FAULT_KINDS)] for k in range(faults)]
    rng.shuffle(kinds)
    for late in [i for i in range(sending, faults) if kinds[i] == DROP]:
        early = [i for i in range(min(sending, faults)) if kinds[i] != DROP]
        if not early:
            break  # too few faults to place every drop early: the rest stay where they are
        swap = rng.choice(early)
        kinds[swap], kinds[late] = kinds[late], kinds[swap]
    return kinds


@dataclass
class Cluster:
    """Workers and beat as subprocesses, and the faults that hit them and the servers."""

    env: dict[str, str]
    log_dir: Path
    redis_server: OwnRedis
    postgres: OwnPostgres
    proxy: BrokerProxy
    stats: redis.Redis
    rng: random.Random
    workers: int
    concurrency: int
    drop_wait_s: float = DROP_WAIT_S
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    missed: Counter[str] = field(default_factory=Counter)
    """Faults that found nothing to hit: a drop for which no task was published in time."""
    dropped: list[str] = field(default_factory=list)
    """The tasks the broker dropped, as ``"<task name> <kwargs>"``."""
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
        """Note (and replace) any process that died without being killed by a fault, the
        broker proxy included."""
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                self.unexpected_exits.append(f"{name} exited with {proc.returncode}")
                del self.procs[name]
                if name == "beat":
                    self._start("beat", ["beat", "-l", "warning"])
                else:
                    self._start_worker()
        if (code := self.proxy.exited()) is not None:
            self.unexpected_exits.append(f"the broker proxy exited with {code}")
            self.proxy.start()

    def inject(self, kind: str) -> bool:
        """Inject one fault of ``kind``; False if there was nothing to hit (no task was
        published for the broker to drop)."""
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
                lease_s = Settings.from_env(self.env).lease_ttl_s
                self.redis_server.pause()
                time.sleep(lease_s + self.rng.uniform(0.3, 1.0))
                self.redis_server.resume()
            case "postgres crashed and restarted":
                self.postgres.crash()
                time.sleep(self.rng.uniform(0.0, 0.5))
                self.postgres.start()
            case "broker dropped a task":
                # Slice wakes and tool tasks in turn: each has its own way back (the wake
                # mark expires; the tool start timeout passes), and each must be taken.
                name = DROPPABLE[self.faults[kind] % len(DROPPABLE)]
                dropped = self.proxy.drop_next_task(name, within_s=self.drop_wait_s)
                if dropped is None:
                    self.missed[kind] += 1  # no task published: not counted
                    return False
                self.dropped.append(dropped)
            case _:
                raise ValueError(f"unknown fault {kind!r}")
        self.faults[kind] += 1
        return True

    def _kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
        self.procs.clear()


def _base_env() -> dict[str, str]:
    import os

    return dict(os.environ)
