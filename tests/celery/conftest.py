"""Celery fixtures: a private PostgreSQL database, Redis prefixes, real worker processes.

Each session creates ``dormant_celery_<hex>`` on the server at ``DORMANT_TEST_POSTGRES_URL``
(migrated with ``upgrade``) and drops it at the end. Each test gets its own key prefix for
dormant's Redis keys and its own broker key prefix (kombu's ``global_keyprefix``), so runs
and tests never see each other's tasks; its keys are deleted at teardown. A test that asks
for RabbitMQ as broker (``deploy(broker="amqp")``) gets the session's own virtual host,
added with ``rabbitmqctl`` on first use and deleted at the end; its queues are deleted at
the test's teardown, so the next test starts from empty queues. Workers and beat are
``python -m celery -A dormant.worker ...`` subprocesses, killed at teardown. Without a
server the tests are skipped loudly, except in CI (``CI=true``) where that is a failure.

Deadlines scale with how slow the machine is right now (``slowness``): a wait returns as
soon as its condition holds, and on a loaded machine (other test runs, CPU hogs) it waits
proportionally longer before calling anything lost. A slow start is never a lost message.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kombu
import kombu.exceptions
import pytest
import redis
from celery_agents import shared_key

from chaos.services import OwnRedis
from dormant.client import Client
from dormant.settings import Settings
from dormant.stores.base import OutboxRow
from tests.databases import temporary_database

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REDIS_URL = os.environ.get("DORMANT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
FLUSH_REDIS_DB = int(os.environ.get("DORMANT_TEST_FLUSH_REDIS_DB", "7"))
"""A Redis database the flush test may FLUSHDB (only if it holds nothing but this run's keys)."""
FLUSH_REDIS_URL = f"{REDIS_URL.rsplit('/', 1)[0]}/{FLUSH_REDIS_DB}"
AMQP_URL = os.environ.get("DORMANT_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
"""RabbitMQ, without a virtual host: each session adds its own with ``rabbitmqctl``."""
BROKERS = ["redis", "amqp"]
"""The brokers the broker-sensitive tests run on (``deploy(broker=...)``)."""
QUEUES = "dormant.interactive,dormant.background,dormant.tools"
SLOWNESS = float(os.environ.get("DORMANT_TEST_SLOWNESS", "1"))
"""A factor on every deadline, on top of the measured load (for machines slow at rest)."""
WORKER_START_S = 60.0
"""How long a worker may take to start on an idle machine (imports, broker connection)."""
TEST_TIMEOUT_S = 300.0
"""A Celery test's hang guard (pytest-timeout) on an idle machine, scaled like deadlines."""
_CLI = (
    "import typer; from dormant.cli.workers import beat, worker; app = typer.Typer(); "
    "app.command()(worker); app.command()(beat); app()"
)


@pytest.fixture
def flush_db_alone() -> Iterator[None]:
    """The test holds Redis database ``FLUSH_REDIS_DB`` alone, waiting for any other test
    (of this run's other pytest-xdist process, or of another run on the machine) that holds
    it: the tests that FLUSHDB it fail when they find each other's keys there. A file lock,
    not an ``xdist_group``: pytest-xdist's groups are ignored under pytest 9.2
    (pytest-dev/pytest-xdist#1386). Ask for it before ``deploy``, so it is let go last."""
    path = Path(tempfile.gettempdir()) / f"dormant-tests-redis-db-{FLUSH_REDIS_DB}.lock"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the Celery tests need PostgreSQL, Redis and RabbitMQ in CI: {reason}")
    pytest.skip(f"!!! CELERY TESTS NOT RUN: {reason}")


@pytest.fixture(scope="session")
def celery_database_url() -> Iterator[str]:
    """A migrated PostgreSQL database private to this session."""
    with temporary_database("dormant_celery", _unavailable) as url:
        yield url


@pytest.fixture
def own_database() -> Iterator[str]:
    """A database of the test's own: the session's is shared by every deployment, and a
    sweep would rightly wake the threads earlier tests left with unapplied rows."""
    with temporary_database("dormant_own", _unavailable) as url:
        yield url


@pytest.fixture(scope="session")
def redis_server() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as exc:
        _unavailable(f"cannot connect to Redis at {REDIS_URL}: {exc}")
    yield client
    client.close()


def rabbitmqctl(*args: str) -> str | None:
    """Run ``rabbitmqctl`` (it needs the node's Erlang cookie: root, or the rabbitmq user);
    None if it succeeded, else why not."""
    try:
        done = subprocess.run(
            ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"rabbitmqctl {args[0]} failed: {exc}"
    if done.returncode != 0:
        return f"rabbitmqctl {' '.join(args)} failed: {done.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def amqp_broker_url() -> Iterator[str]:
    """A RabbitMQ virtual host private to this session, as a broker URL."""
    try:
        with kombu.Connection(f"{AMQP_URL}//", connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except (OSError, kombu.exceptions.KombuError) as exc:
        _unavailable(f"cannot connect to RabbitMQ at {AMQP_URL}: {exc}")
    vhost = f"dormant_test_{secrets.token_hex(5)}"
    if failure := rabbitmqctl("add_vhost", vhost):
        _unavailable(failure)
    try:
        user = urlsplit(AMQP_URL).username or "guest"
        if failure := rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*"):
            _unavailable(failure)
        yield f"{AMQP_URL}/{vhost}"
    finally:
        if failure := rabbitmqctl("delete_vhost", vhost):
            print(f"!!! the RabbitMQ virtual host {vhost} is left behind: {failure}")


def _delete_amqp_queues(broker_url: str) -> None:
    """Delete dormant's queues (and what a dead test left in them) from the virtual host."""
    with kombu.Connection(broker_url, connect_timeout=10) as conn:
        channel = conn.default_channel
        for name in QUEUES.split(","):
            channel.queue_delete(name)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A ``redis-server`` of this test's own on a free port, to kill, pause or flush."""
    if shutil.which("redis-server") is None:
        _unavailable("redis-server is not installed")
    server = OwnRedis(tmp_path / "own-redis")
    server.start()
    yield server
    server.stop()


def slowness() -> float:
    """How many times slower than an idle machine this one is now: the 1-minute load
    average per core (at least 1), times ``DORMANT_TEST_SLOWNESS``."""
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return SLOWNESS * max(1.0, per_core)


def scaled(timeout_s: float) -> float:
    """``timeout_s`` of an idle machine, as seconds on this machine now."""
    return timeout_s * slowness()


def wait_until(
    predicate: Callable[[], Any],
    timeout_s: float,
    what: str,
    *,
    check: Callable[[], None] = lambda: None,
    poll_s: float = 0.05,
    detail: Callable[[], str] = lambda: "",
) -> Any:
    """Poll ``predicate`` until it is truthy (returned) or ``timeout_s`` of idle-machine
    time passes (failure, with ``detail()`` appended). Each poll's wall time counts divided
    by the current ``slowness``, so a loaded machine gets proportionally longer. ``check``
    runs on every poll to fail fast (a worker that died)."""
    started = last = time.monotonic()
    spent_s = 0.0
    while True:
        check()
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        spent_s += (now - last) / slowness()
        last = now
        if spent_s > timeout_s:
            pytest.fail(
                f"timed out waiting for {what}: {timeout_s} s of idle-machine time "
                f"({now - started:.0f} s of wall time at load {os.getloadavg()[0]:.1f})" + detail()
            )
        time.sleep(poll_s)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    """Give each Celery test a hang guard scaled to the machine's load when it starts (set
    before pytest-timeout reads it); the waits inside scale themselves as they go."""
    if Path(str(item.path)).is_relative_to(HERE) and item.get_closest_marker("timeout") is None:
        item.add_marker(pytest.mark.timeout(scaled(TEST_TIMEOUT_S)))
    return (yield)


@dataclass
class Proc:
    """A worker or beat subprocess, its output in a log file shown when a test fails."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]


@dataclass
class Deployment:
    """One isolated dormant deployment: env for processes, a client, its Redis keys."""

    env: dict[str, str]
    prefix: str
    redis: redis.Redis
    log_dir: Path
    broker: str = "redis"
    procs: list[Proc] = field(default_factory=list)
    clients: list[Client] = field(default_factory=list)
    expected_deaths: set[str] = field(default_factory=set)

    @property
    def settings(self) -> Settings:
        return Settings.from_env(self.env)

    def client(self) -> Client:
        client = Client.from_env(self.env)
        self.clients.append(client)
        return client

    def key(self, *parts: str) -> str:
        return shared_key(self.prefix, *parts)

    @staticmethod
    def unran(client: Client, thread_id: str) -> list[OutboxRow]:
        """The thread's outbox rows a sweep would still dispatch, at any time from now.

        Only this thread's: the session's database is shared by every deployment in the
        run, and another test may leave rows of its own threads behind.
        """
        later = datetime.now(UTC) + timedelta(days=1)
        rows = client.store.undispatched(later, limit=10_000, lost_before=later)
        return [row for row in rows if row.thread_id == thread_id]

    def start_worker(
        self,
        name: str,
        *,
        concurrency: int = 8,
        env: dict[str, str] | None = None,
        queues: str = QUEUES,
    ) -> Proc:
        argv = [
            *("-A", "dormant.worker", "worker", "-P", "threads", "-c", str(concurrency)),
            *(
                "-Q",
                queues,
                "-n",
                f"{name}.{self.prefix}@%h",
                "-l",
                os.environ.get("TEST_CELERY_LOGLEVEL", "warning"),
            ),
            *("--without-heartbeat", "--without-gossip", "--without-mingle"),
        ]
        return self._start(name, argv, {**(env or {}), "TEST_WORKER_ID": name})

    def start_beat(self) -> Proc:
        return self._start("beat", ["-A", "dormant.worker", "beat", "-l", "warning"], {})

    def start_cli(self, name: str, *args: str) -> Proc:
        """``dormant worker ...`` or ``dormant beat``, the Typer commands of ``cli/workers.py``."""
        argv = ["-c", _CLI, *args]
        return self._start(name, argv, {"TEST_WORKER_ID": name}, module=False)

    def _start(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        *,
        module: bool = True,
        cwd: Path | None = None,
    ) -> Proc:
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [sys.executable, *(["-m", "celery"] if module else []), *argv],
                env={**os.environ, **self.env, **env},
                cwd=cwd or ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def wait_ready(self, *workers: Proc, timeout_s: float = WORKER_START_S) -> None:
        """Until each worker has connected and announced itself (``worker_ready``)."""
        for worker in workers:
            wait_until(
                lambda w=worker: self.redis.exists(self.key("ready", w.name)),
                timeout_s,
                f"worker {worker.name} to start",
                check=self.check_alive,
            )

    def check_alive(self) -> None:
        for proc in self.procs:
            if not proc.alive() and proc.name not in self.expected_deaths:
                pytest.fail(f"{proc.name} died (exit {proc.popen.returncode}):\n{proc.log()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.log()}" for p in self.procs)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        for client in self.clients:
            client.close()
        if self.broker == "amqp":
            _delete_amqp_queues(self.env["DORMANT_BROKER_URL"])
        for url in {self.env["DORMANT_REDIS_URL"], REDIS_URL}:
            conn = redis.Redis.from_url(url, socket_connect_timeout=3)
            try:
                keys = list(conn.scan_iter(match=f"{self.prefix}*", count=1000))
                for start in range(0, len(keys), 500):
                    conn.delete(*keys[start : start + 500])
            except redis.ConnectionError:
                pass  # a test's own Redis, stopped already: nothing left to clean
            finally:
                conn.close()


@pytest.fixture
def deploy(
    celery_database_url: str,
    redis_server: redis.Redis,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., Deployment]]:
    """Make a deployment with ``DORMANT_*`` overrides: ``deploy(DORMANT_LEASE_TTL_S="2")``.

    ``broker="amqp"`` puts its tasks on RabbitMQ (the session's virtual host) instead of
    Redis; the lease, dedup ids, wake marks and events stay in Redis, as in production."""
    made: list[Deployment] = []

    def make(broker: str = "redis", **overrides: str) -> Deployment:
        prefix = f"dct{secrets.token_hex(5)}"
        if broker == "amqp":
            broker_env = {"DORMANT_BROKER_URL": request.getfixturevalue("amqp_broker_url")}
        else:
            assert broker == "redis", f"unknown broker {broker!r}"
            broker_env = {
                "DORMANT_BROKER_URL": REDIS_URL,
                "DORMANT_BROKER_KEY_PREFIX": f"{prefix}:broker:",
            }
        env = {
            "DORMANT_DATABASE_URL": celery_database_url,
            **broker_env,
            "DORMANT_REDIS_URL": REDIS_URL,
            "DORMANT_TEST_REDIS_URL": REDIS_URL,
            "DORMANT_KEY_PREFIX": prefix,
            "DORMANT_SECRET_KEY": secrets.token_hex(16),
            "DORMANT_AGENTS": "celery_agents",
            "DORMANT_SWEEP_INTERVAL_S": "1",
            "DORMANT_OUTBOX_GRACE_S": "2",
            "DORMANT_FAILURE_BACKOFF_S": "0.2",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
            **overrides,
        }
        log_dir = tmp_path / prefix
        log_dir.mkdir()
        deployment = Deployment(env, prefix, redis_server, log_dir, broker)
        made.append(deployment)
        return deployment

    yield make
    failed = getattr(request.node, "rep_call", None)
    for deployment in made:
        if failed is not None and failed.failed:
            print(deployment.logs())
        deployment.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Keep each phase's report on the item, so fixtures can print logs after a failure."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
