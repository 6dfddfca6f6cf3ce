"""A private Redis server and a private PostgreSQL cluster that a test may kill at will.

Faults are injected into servers nobody else uses: ``OwnRedis`` is a ``redis-server`` on a
free port (no persistence), ``OwnPostgres`` a cluster made by ``initdb`` under a temporary
directory, stopped with ``pg_ctl -m immediate`` (a crash: no checkpoint, clients cut off).
The shared servers of the machine are never touched.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import redis

__all__ = ["OwnPostgres", "OwnRedis", "free_port", "redis_answers"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@dataclass
class OwnRedis:
    """A ``redis-server`` of our own: started, killed, restarted on the same port, paused."""

    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 30.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "redis.log").open("ab") as log:
            self.process = self._spawn(log)
        self.paused = False
        _wait(self.ping, timeout_s, f"redis-server on port {self.port}")

    def _spawn(self, log: BinaryIO) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--maxclients",
                "2000",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def ping(self) -> bool:
        return redis_answers(self.port)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=2, socket_timeout=5)

    def kill(self) -> None:
        """SIGKILL: every key is gone (no persistence), every connection cut."""
        if self.process is not None:
            if self.paused:
                self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=30)
            self.process = None
            self.paused = False

    def restart(self) -> None:
        self.kill()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing answers (a stalled or partitioned server)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.process is not None and self.paused:
            self.process.send_signal(signal.SIGCONT)
            self.paused = False

    def flushall(self) -> None:
        client = self.client()
        try:
            client.flushall()
        finally:
            client.close()

    def stop(self) -> None:
        self.kill()


def _as_postgres() -> list[str]:
    """PostgreSQL refuses to run as root: as root, its commands run as the postgres user."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _pg(name: str, *args: str) -> list[str]:
    return [*_as_postgres(), _pg_bin(name), *args]


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} not found (install PostgreSQL's server binaries)")
    return path


@dataclass
class OwnPostgres:
    """A PostgreSQL cluster of our own, under ``directory``, trust authentication."""

    directory: Path
    port: int = field(default_factory=free_port)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        initdb = ("-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
        subprocess.run(_pg("initdb", *initdb), check=True, capture_output=True)
        # fsync off is safe here (a crash kills processes, never the OS); synchronous_commit
        # must stay on: off, an immediate stop loses commits the clients were told of.
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.directory}'\nmax_connections = 300\n"
                "fsync = off\nfull_page_writes = off\n"
                "shared_buffers = 64MB\n"
            )

    def start(self, timeout_s: float = 60.0) -> None:
        log = str(self.directory / "pg.log")
        start = ("-D", str(self.data), "-l", log, "-w", "-t", str(int(timeout_s)), "start")
        subprocess.run(_pg("pg_ctl", *start), check=True, capture_output=True)

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: every backend dies, recovery runs at the next start."""
        subprocess.run(
            _pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"),
            check=True,
            capture_output=True,
        )

    def restart(self) -> None:
        self.crash()
        self.start()

    def create_database(self, name: str) -> str:
        subprocess.run(
            _pg("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name),
            check=True,
            capture_output=True,
        )
        return self.url(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                _pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"),
                capture_output=True,
                check=False,
            )

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def available() -> str:
    """Why these services cannot run here, or "" if they can."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed"
    try:
        _pg_bin("initdb")
    except FileNotFoundError as error:
        return str(error)
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "initdb refuses to run as root and runuser is missing"
    return ""


def redis_answers(port: int) -> bool:
    """Whether a Redis (or something speaking its protocol) answers PING on ``port``."""
    client = redis.Redis(port=port, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()
