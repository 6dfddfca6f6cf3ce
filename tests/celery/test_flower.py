"""Flower next to a worker: its HTTP API lists dormant's tasks from the task events alone
(no result backend), each slice with its ``thread_id`` and its short outcome string.

Flower runs as ``python -m celery -A dormant.worker flower`` with the workers' environment;
its API answers without authentication only with ``FLOWER_UNAUTHENTICATED_API``, so it
listens on 127.0.0.1 alone. If Flower is missing or cannot start, the test is skipped loudly
(a failure in CI).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from conftest import WORKER_START_S, Deployment, Proc, wait_until

from dormant.client import Client
from dormant.messages import AssistantTurn

OUTCOME = re.compile(r"^'(idle|waiting:\d+|busy|closed|stale)'$")
"""A slice's result as Flower shows it: the repr of ``outcome_text``."""
Task = dict[str, Any]


def _flower_unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the Flower test must run in CI: {reason}")
    pytest.skip(f"!!! FLOWER TEST NOT RUN: {reason}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Flower:
    def __init__(self, proc: Proc, port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"

    def tasks(self) -> dict[str, Task] | None:
        """``GET /api/tasks``, or None while Flower does not answer."""
        try:
            response = httpx.get(f"{self.url}/api/tasks", timeout=2.0)
        except httpx.TransportError:
            return None
        response.raise_for_status()
        tasks: dict[str, Task] = response.json()
        return tasks


def _start_flower(d: Deployment) -> Flower:
    if importlib.util.find_spec("flower") is None:
        _flower_unavailable("flower is not installed (it is in the dev dependency group)")
    port = _free_port()
    argv = ["-A", "dormant.worker", "flower", f"--port={port}", "--address=127.0.0.1"]
    # Flower's task list is built from the events it receives: persistence stays off.
    proc = d._start("flower", argv, {"FLOWER_UNAUTHENTICATED_API": "true"})
    flower = Flower(proc, port)

    def exited() -> None:
        if not proc.alive():
            _flower_unavailable(f"flower exited with {proc.popen.returncode}:\n{proc.log()}")

    # A slow start is not a missing Flower: wait as long as any process start.
    wait_until(
        lambda: flower.tasks() is not None,
        WORKER_START_S,
        f"flower to answer on {flower.url}",
        check=exited,
        poll_s=0.1,
        detail=proc.log,
    )
    return flower


def _of_thread(tasks: dict[str, Task], name: str, thread_id: str) -> list[Task]:
    return [
        t
        for t in tasks.values()
        if t.get("name") == name and f"'thread_id': '{thread_id}'" in (t.get("kwargs") or "")
    ]


def _wait_until_flower_listens(d: Deployment, client: Client, flower: Flower) -> None:
    """Events sent before Flower subscribed are lost to it: launch probe threads until one
    of their slices shows up in Flower, so the scenario's events are all seen."""
    probes: list[str] = []
    launched: list[float] = []

    def seen() -> bool:
        tasks = flower.tasks() or {}
        if any(_of_thread(tasks, "dormant.slice", p) for p in probes):
            return True
        if len(probes) < 20 and (not probes or time.monotonic() - launched[-1] > 1.0):
            probes.append(client.launch("echo", "probe"))
            launched.append(time.monotonic())
        return False

    wait_until(seen, 20, "Flower to receive task events", check=d.check_alive, poll_s=0.1)


def test_flower_lists_dormant_tasks_with_thread_ids_and_outcomes(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy()
    worker = d.start_worker("w1", concurrency=2)
    flower = _start_flower(d)
    d.wait_ready(worker)
    client = d.client()
    _wait_until_flower_listens(d, client, flower)

    thread_id = client.launch("calc", "add 2 and 3")

    def done() -> tuple[list[Task], list[Task]] | None:
        history = client.history(thread_id)
        if not history or history[-1] != AssistantTurn(text="done: 5"):
            return None
        tasks = flower.tasks() or {}
        slices = _of_thread(tasks, "dormant.slice", thread_id)
        tools = _of_thread(tasks, "dormant.tool", thread_id)
        results = {t.get("result") for t in slices}
        finished = all(t.get("state") == "SUCCESS" for t in [*slices, *tools])
        if finished and {"'waiting:1'", "'idle'"} <= results and tools:
            return slices, tools
        return None

    found = wait_until(done, 25, "Flower to show the thread's tasks", check=d.check_alive)
    slices, tools = found
    for task in slices:
        assert task["kwargs"] == f"{{'thread_id': '{thread_id}'}}", task
        assert OUTCOME.match(task["result"] or ""), task
        assert task["worker"].startswith(f"w1.{d.prefix}@"), task
    assert [t["result"] for t in slices].count("'waiting:1'") == 1, slices
    assert len(tools) == 1, tools
    (tool,) = tools
    call_id = next(
        c.call_id
        for i in client.history(thread_id)
        if isinstance(i, AssistantTurn)
        for c in i.calls
    )
    assert f"'call_id': '{call_id}'" in tool["kwargs"] and "'action': 'tool'" in tool["kwargs"]
    assert tool["result"] == "'done'", tool
    assert tool["worker"].startswith(f"w1.{d.prefix}@"), tool
