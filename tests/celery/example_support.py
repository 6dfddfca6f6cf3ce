"""Running an example project as its README says: its own commands, as subprocesses, on an
empty PostgreSQL database and the test Redis, each run under its own key prefixes."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
from conftest import REDIS_URL, Proc, wait_until
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.databases import POSTGRES_ADMIN_URL, admin_engine

__all__ = ["EXAMPLES", "ExampleRun", "empty_database", "example_run"]

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
BIN = Path(sys.executable).parent


@contextmanager
def empty_database(prefix: str) -> Iterator[tuple[str, str]]:
    """An empty PostgreSQL database (no dormant schema): its name and URL; dropped after."""
    admin = admin_engine()
    name = f"{prefix}_{secrets.token_hex(5)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield name, make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@dataclass
class ExampleRun:
    """One example project's processes, started in its directory with the README's commands."""

    cwd: Path
    env: dict[str, str]
    prefix: str
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)

    def run(self, *argv: str) -> str:
        """A command that must succeed (``manage.py migrate``); its output."""
        done = subprocess.run(
            argv, cwd=self.cwd, env=self._env(), capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    def start(self, name: str, *argv: str) -> Proc:
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                argv, cwd=self.cwd, env=self._env(), stdout=log, stderr=subprocess.STDOUT
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def check_alive(self) -> None:
        for proc in self.procs:
            assert proc.alive(), f"{proc.name} died:\n{proc.log()}"

    def serve(self, name: str, *argv: str, port: int) -> str:
        """Start a web server command and wait until it answers; its base URL."""
        self.start(name, *argv)
        base = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            try:
                httpx.get(f"{base}/orders/0/", timeout=2)
            except httpx.TransportError:
                return False
            return True

        wait_until(answers, 120, f"{name} to answer", check=self.check_alive, poll_s=0.2)
        return base

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.log()}" for p in self.procs)

    def _env(self) -> dict[str, str]:
        path = os.pathsep.join([str(BIN), os.environ.get("PATH", "")])
        return {**os.environ, **self.env, "PATH": path}

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        conn = redis.Redis.from_url(REDIS_URL)
        keys = list(conn.scan_iter(match=f"{self.prefix}*", count=1000))
        if keys:
            conn.delete(*keys)
        conn.close()


@contextmanager
def example_run(name: str, env: dict[str, str], prefix: str, log_dir: Path) -> Iterator[ExampleRun]:
    run = ExampleRun(EXAMPLES / name, env, prefix, log_dir)
    try:
        yield run
    except BaseException:
        print(run.logs())
        raise
    finally:
        run.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
