"""``celery -A proj worker`` on an app with dormant installed loads the agents as it starts.

A worker whose agents module is mistyped or raises on import (``broken_agents``: a down
MCP server; a key read on a host without it) refuses to start with one line, as
``dormant worker`` does, instead of saying ``ready.`` and failing every slice; a worker of
the project's own queues only needs no agents.
"""

from __future__ import annotations

import pytest
from conftest import Deployment, Proc, wait_until

from dormant.messages import AssistantTurn


def _start(deployment: Deployment, agents: str, *options: str) -> Proc:
    name = f"proj.{deployment.prefix}@localhost"
    argv = ["-A", "proj_named_app", "worker", "-c", "2", "-n", name, "-l", "warning", *options]
    return deployment._start("proj", argv, {"TEST_WORKER_ID": "proj", "PROJ_AGENTS": agents})


@pytest.mark.parametrize(
    ("agents", "pool", "error"),
    [
        (
            "broken_agents",
            "prefork",
            "error: a worker cannot start: the agents module 'broken_agents' raised "
            "RuntimeError: the MCP server at http://127.0.0.1:1/mcp is down",
        ),
        (
            "broken_agents",
            "threads",
            "error: a worker cannot start: the agents module 'broken_agents' raised "
            "RuntimeError: the MCP server at http://127.0.0.1:1/mcp is down",
        ),
        (
            "celery_agentz",
            "prefork",
            "error: a worker cannot start: cannot import agents module 'celery_agentz': "
            "No module named 'celery_agentz'",
        ),
    ],
)
def test_a_worker_whose_agents_cannot_load_exits_saying_why(
    deploy: object, agents: str, pool: str, error: str
) -> None:
    deployment: Deployment = deploy()  # type: ignore[operator]
    worker = _start(deployment, agents, "-P", pool)
    wait_until(lambda: not worker.alive(), 60, "the worker to exit", detail=worker.log)
    log = worker.log()
    assert worker.popen.returncode != 0, log
    assert error in log.splitlines(), log
    assert "Traceback" not in log and "ready" not in log, log
    assert not deployment.redis.exists(deployment.key("ready", "proj"))


def test_a_worker_whose_agents_load_starts_and_runs_them(deploy: object) -> None:
    deployment: Deployment = deploy()  # type: ignore[operator]
    _start(deployment, "celery_agents")
    deployment.wait_ready(deployment.procs[0], timeout_s=90)
    client = deployment.client()
    thread_id = client.launch("calc", "add two and three")

    def answered() -> bool:
        return any(
            isinstance(item, AssistantTurn) and item.text == "done: 5"
            for item in client.history(thread_id)
        )

    wait_until(answered, 90, "the calc agent to finish", check=deployment.check_alive)


def test_a_worker_of_the_projects_own_queue_only_needs_no_agents(deploy: object) -> None:
    deployment: Deployment = deploy()  # type: ignore[operator]
    _start(deployment, "broken_agents", "-Q", "proj")
    deployment.wait_ready(deployment.procs[0], timeout_s=90)
