"""Lost tool work comes back in seconds on real workers: a tool task whose claim meets a
stopped PostgreSQL is retried by Celery and runs once, and a tool task the broker lost is
sent again by beat's sweep within the default ``tool_start_timeout_s``.

The tool queue has a worker of its own, started only once the tool task is queued, so the
task meets exactly the fault each test sets up."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.services import OwnPostgres, available
from dormant.client import Client
from dormant.messages import ToolResult
from dormant.stores.base import ThreadStatus
from dormant.stores.sql import upgrade
from tests.celery.conftest import Deployment, _unavailable, wait_until

SLICE_QUEUES = "dormant.interactive,dormant.background"
TOOL_QUEUE = "dormant.tools"
RESENT_WITHIN_S = 30.0
"""Lost tool work is back and done this soon, with the shipped defaults (issue 31)."""


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    """A PostgreSQL cluster this test may stop: the shared server never is."""
    why = available()
    if why:
        _unavailable(why)
    work = Path(tempfile.mkdtemp(prefix="dormant-claims-"))
    work.chmod(0o755)  # the cluster's user (postgres, when run as root) must reach it
    pg = OwnPostgres(work / "pg")
    try:
        pg.init()
        pg.start()
        yield pg
    finally:
        pg.remove()
        shutil.rmtree(work, ignore_errors=True)


def _queued_tool_tasks(d: Deployment) -> list[str]:
    """The broker's lists holding ``dormant.tools`` tasks (one per priority step)."""
    pattern = f"{d.env['DORMANT_BROKER_KEY_PREFIX']}{TOOL_QUEUE}*"
    return [k for k in d.redis.scan_iter(match=pattern) if d.redis.llen(k)]


def _tally_runs(d: Deployment) -> int:
    return int(d.redis.get(d.key("runs", "tally")) or 0)


def _launch_until_the_tool_task_is_queued(d: Deployment, client: Client) -> str:
    slices = d.start_worker("slices", queues=SLICE_QUEUES)
    d.wait_ready(slices)
    thread_id = client.launch("tallier", "count the stock")
    wait_until(lambda: _queued_tool_tasks(d), 60, "the tool task to be queued", check=d.check_alive)
    return thread_id


def _answered_once(d: Deployment, client: Client, thread_id: str) -> Callable[[], bool]:
    def done() -> bool:
        try:
            return client.thread(thread_id).status is ThreadStatus.IDLE and _tally_runs(d) >= 1
        except Exception:
            return False  # the database is still coming back

    return done


def test_a_tool_task_whose_claim_meets_a_stopped_database_is_retried_and_runs_once(
    deploy: Callable[..., Deployment], own_postgres: OwnPostgres
) -> None:
    url = own_postgres.create_database("dormant")
    upgrade(url)
    d = deploy(DORMANT_DATABASE_URL=url)  # no beat: no sweep re-sends the task
    client = d.client()
    thread_id = _launch_until_the_tool_task_is_queued(d, client)

    own_postgres.crash()
    tools = d.start_worker("tools", queues=TOOL_QUEUE)
    d.wait_ready(tools)  # it starts while the database is down
    wait_until(
        lambda: "so the claim is tried again" in tools.log(),
        60,
        "the tool task's claim to meet the stopped database",
        check=d.check_alive,
    )
    own_postgres.start()

    wait_until(
        _answered_once(d, client, thread_id),
        90,
        "the retried tool task to run and its thread to finish",
        check=d.check_alive,
        detail=d.logs,
    )
    assert _tally_runs(d) == 1
    results = [i for i in client.history(thread_id) if isinstance(i, ToolResult)]
    assert [r.content for r in results] == ["counted stock"]


def test_a_tool_task_the_broker_lost_is_sent_again_within_the_tool_start_timeout(
    deploy: Callable[..., Deployment], own_database: str
) -> None:
    d = deploy(DORMANT_DATABASE_URL=own_database)
    assert "DORMANT_TOOL_START_TIMEOUT_S" not in d.env
    client = d.client()
    d.start_beat()
    thread_id = _launch_until_the_tool_task_is_queued(d, client)

    d.redis.delete(*_queued_tool_tasks(d))  # the broker loses it (a flushed Redis would)
    lost_at = time.monotonic()
    tools = d.start_worker("tools", queues=TOOL_QUEUE)
    d.wait_ready(tools)

    # The re-send comes a sweep after the timeout (20 s); the rest is the run and a slice.
    wait_until(
        _answered_once(d, client, thread_id),
        RESENT_WITHIN_S,
        "the lost tool task to be sent again and run",
        check=d.check_alive,
        detail=d.logs,
    )
    assert _tally_runs(d) == 1
    print(f"re-sent and run {time.monotonic() - lost_at:.1f} s after the loss")
