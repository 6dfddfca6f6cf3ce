"""Flower next to real workers tells the truth about dormant: each slice is named by its
agent (``dormant.slice[calc]``) and each tool task by its tool (``dormant.tool[add]``); a
slice's result says what the thread is doing (``waiting on add (call_...)``); a stalled
thread's slices are FAILUREs with the reason, in the API and in ``/metrics``; sweeps are
neither rows nor log lines. Everything comes from task events (no result backend).

Flower runs as ``python -m celery -A dormant.worker flower`` with the workers' environment
minus ``DORMANT_AGENTS`` (Flower needs no agents); its API answers without authentication
only with ``FLOWER_UNAUTHENTICATED_API``, so it listens on 127.0.0.1 alone. If Flower is
missing or cannot start, the test is skipped loudly (a failure in CI).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import QUEUES, WORKER_START_S, Deployment, Proc, wait_until

from dormant.client import Client, new_message_id
from dormant.messages import AssistantTurn, UserMessage
from dormant.stores.base import Priority, ThreadStatus

Task = dict[str, Any]
DEADLINE_S = 60
ROOT = Path(__file__).resolve().parents[2]
SEARCH_TOOL_ERRORS = "name:dormant.tool result:error"
"""docs/monitoring.md's search for tool runs that raised."""


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

    def tasks(self, **params: str) -> dict[str, Task] | None:
        """``GET /api/tasks``, or None while Flower does not answer."""
        try:
            response = httpx.get(f"{self.url}/api/tasks", params=params, timeout=5.0)
        except httpx.TransportError:
            return None
        response.raise_for_status()
        tasks: dict[str, Task] = response.json()
        return tasks

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus' text format."""
        response = httpx.get(f"{self.url}/metrics", timeout=5.0)
        response.raise_for_status()
        return response.text


def documented_columns() -> list[str]:
    """The ``--tasks_columns`` docs/monitoring.md tells users to start Flower with."""
    text = (ROOT / "docs" / "monitoring.md").read_text()
    (columns,) = set(re.findall(r"--tasks_columns=([\w,]+)", text))
    return columns.split(",")


def _start_flower(d: Deployment, *options: str) -> Flower:
    if importlib.util.find_spec("flower") is None:
        _flower_unavailable("flower is not installed (it is in the dev dependency group)")
    port = _free_port()
    argv = ["-A", "dormant.worker", "flower", f"--port={port}", "--address=127.0.0.1", *options]
    # Flower's task list is built from the events it receives: persistence stays off.
    env = {"FLOWER_UNAUTHENTICATED_API": "true", "DORMANT_AGENTS": ""}
    proc = d._start("flower", argv, env)
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


def _start_worker(d: Deployment, name: str, loglevel: str) -> Proc:
    """A worker like ``Deployment.start_worker``, at a chosen log level."""
    argv = [
        *("-A", "dormant.worker", "worker", "-P", "threads", "-c", "2", "-Q", QUEUES),
        *("-n", f"{name}.{d.prefix}@%h", "-l", loglevel),
        *("--without-heartbeat", "--without-gossip", "--without-mingle"),
    ]
    return d._start(name, argv, {"TEST_WORKER_ID": name})


def _is(task: Task, kind: str) -> bool:
    name = task.get("name") or ""
    return name == kind or name.startswith(f"{kind}[")


def _of_thread(tasks: dict[str, Task], kind: str, thread_id: str) -> list[Task]:
    return [
        t
        for t in tasks.values()
        if _is(t, kind) and f"'thread_id': '{thread_id}'" in (t.get("kwargs") or "")
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
        if len(probes) < 30 and (not probes or time.monotonic() - launched[-1] > 1.0):
            probes.append(client.launch("echo", "probe"))
            launched.append(time.monotonic())
        return False

    wait_until(seen, DEADLINE_S, "Flower to receive task events", check=d.check_alive, poll_s=0.2)


@pytest.mark.timeout(300)
def test_flower_names_slices_by_agent_and_tools_by_tool_and_says_what_the_thread_waits_on(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy()
    worker = d.start_worker("w1", concurrency=2)
    flower = _start_flower(d)
    d.wait_ready(worker, timeout_s=DEADLINE_S)
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
        finished = all(t.get("state") == "SUCCESS" for t in [*slices, *tools])
        if finished and "'idle'" in {t.get("result") for t in slices} and tools:
            return slices, tools
        return None

    slices, tools = wait_until(
        done, DEADLINE_S, "Flower to show the thread's tasks", check=d.check_alive
    )
    call_id = next(
        c.call_id
        for i in client.history(thread_id)
        if isinstance(i, AssistantTurn)
        for c in i.calls
    )
    assert sorted(t["result"] for t in slices) == [
        "'idle'",
        f"'waiting on add ({call_id})'",
    ], slices
    for task in slices:
        assert task["name"] == "dormant.slice[calc]", task
        assert task["kwargs"] == f"{{'thread_id': '{thread_id}'}}", task
        assert task["worker"].startswith(f"w1.{d.prefix}@"), task
    (tool,) = tools
    assert tool["name"] == "dormant.tool[add]", tool
    assert f"'call_id': '{call_id}'" in tool["kwargs"] and "'action': 'tool'" in tool["kwargs"]
    assert tool["result"] == "'done'", tool
    # Flower's own filter by task type finds the agent's slices.
    assert set(flower.tasks(taskname="dormant.slice[calc]") or {}) >= {t["uuid"] for t in slices}


@pytest.mark.timeout(300)
def test_flower_says_what_each_tool_run_did_and_shows_the_thread_id_in_the_documented_columns(
    deploy: Callable[..., Deployment],
) -> None:
    """A deferred tool whose result has not come and a tool that raised both showed 'done'."""
    d = deploy()
    worker = d.start_worker("w1", concurrency=2)
    columns = documented_columns()
    flower = _start_flower(d, f"--tasks_columns={','.join(columns)}")
    d.wait_ready(worker, timeout_s=DEADLINE_S)
    client = d.client()
    _wait_until_flower_listens(d, client, flower)

    thread_id = client.launch("toolbox", "build main")

    def both_tools_ran() -> dict[str, Task] | None:
        tools = _of_thread(flower.tasks() or {}, "dormant.tool", thread_id)
        if len(tools) == 2 and all(t.get("state") == "SUCCESS" for t in tools):
            return {t["name"]: t for t in tools}
        return None

    tools = wait_until(
        both_tools_ran, DEADLINE_S, "Flower to show both tool runs", check=d.check_alive
    )
    assert tools["dormant.tool[run_build]"]["result"] == "'started; result pending via callback'"
    assert tools["dormant.tool[explode]"]["result"] == "'error: RuntimeError: disk full'"
    assert client.thread(thread_id).status is ThreadStatus.WAITING  # run_build still pending

    # Flower draws the columns in the order given. It cuts args, kwargs and result at 400
    # pixels, but not the exception, so every column after a long exception is off screen:
    # the thread id (in kwargs) must come before it.
    page = httpx.get(f"{flower.url}/tasks", timeout=5.0).text
    shown = re.findall(r'<th data-column="(\w+)"', page)
    assert shown == columns, shown
    assert shown.index("kwargs") < shown.index("exception"), shown
    assert f"'thread_id': '{thread_id}'" in tools["dormant.tool[explode]"]["kwargs"]

    # The search docs/monitoring.md gives finds the tool that raised, not the deferred one.
    assert f"`{SEARCH_TOOL_ERRORS}`" in (ROOT / "docs" / "monitoring.md").read_text()
    params = {
        **{"draw": "1", "start": "0", "length": "100", "search[value]": SEARCH_TOOL_ERRORS},
        **{"order[0][column]": "0", "order[0][dir]": "desc", "columns[0][data]": "received"},
    }
    found = httpx.get(f"{flower.url}/tasks/datatable", params=params, timeout=5.0).json()
    assert {t["uuid"] for t in found["data"]} == {tools["dormant.tool[explode]"]["uuid"]}


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample, 0 if absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if not sample.startswith(f"{name}{{"):
            continue
        found = ",".join(sorted(sample[len(name) + 1 : -1].split(",")))
        if found == wanted:
            return float(value)
    return 0.0


@pytest.mark.timeout(300)  # three processes start on a loaded machine
def test_a_stalled_threads_slices_are_failures_with_the_reason_in_flower_and_its_metrics(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_STALL_AFTER_FAILURES="2")
    worker = _start_worker(d, "w1", "info")
    flower = _start_flower(d)
    d.wait_ready(worker, timeout_s=DEADLINE_S)
    client = d.client()
    _wait_until_flower_listens(d, client, flower)

    broken = client.launch("broken", "hello")
    wait_until(
        lambda: client.thread(broken).status is ThreadStatus.STALLED,
        DEADLINE_S,
        "the broken thread to stall",
        check=d.check_alive,
        poll_s=0.1,
    )
    client.send(broken, "are you there?")  # a slice of a stalled thread: a failure too

    def stalled_failures() -> list[Task]:
        failed = flower.tasks(state="FAILURE") or {}
        mine = _of_thread(failed, "dormant.slice", broken)
        stalled = [t for t in mine if t["exception"].startswith('SliceFailed("stalled: ')]
        return stalled if len(stalled) >= 2 else []

    stalled = wait_until(
        stalled_failures, DEADLINE_S, "Flower to list the stalled slices as failures"
    )
    for task in stalled:
        assert task["name"] == "dormant.slice[broken]", task
        assert "stalled: ModelFatal: provider refused call" in task["exception"], task
        assert task["exception"].endswith(f"(thread '{broken}')\")"), task
    workers = {t["worker"] for t in stalled}
    (hostname,) = workers
    metrics = flower.metrics()
    failed = _metric(
        metrics,
        "flower_events_total",
        task="dormant.slice[broken]",
        type="task-failed",
        worker=hostname,
    )
    assert failed >= 2, metrics

    # Acked, not requeued: no message of this deployment is queued or unacknowledged.
    def broker_empty() -> bool:
        keys = list(d.redis.scan_iter(match=f"{d.prefix}:broker:*", count=1000))
        held = {k: d.redis.type(k) for k in keys}
        return not [
            k
            for k, kind in held.items()
            if (kind == "list" and d.redis.llen(k)) or (kind == "hash" and d.redis.hlen(k))
        ]

    wait_until(broker_empty, DEADLINE_S, "the broker to hold no message", check=d.check_alive)
    log = worker.log()
    assert f"Task dormant.slice[broken][{stalled[0]['uuid']}] raised expected: SliceFailed" in log
    assert "Traceback" not in log, log


@pytest.mark.timeout(300)
def test_sweeps_are_neither_rows_in_flower_nor_lines_in_the_worker_log(
    deploy: Callable[..., Deployment], own_database: str
) -> None:
    # Its own database: beat's sweep would rightly wake threads earlier tests left, and then
    # say "woke 2 threads".
    d = deploy(DORMANT_SWEEP_INTERVAL_S="0.5", DORMANT_DATABASE_URL=own_database)
    worker = _start_worker(d, "w1", "info")
    beat = d._start("beat", ["-A", "dormant.worker", "beat", "-l", "debug"], {})
    flower = _start_flower(d)
    d.wait_ready(worker, timeout_s=DEADLINE_S)
    client = d.client()
    _wait_until_flower_listens(d, client, flower)
    thread_id = client.launch("echo", "one")
    wait_until(
        lambda: client.history(thread_id)[-1:] == [AssistantTurn(text="seen 1")],
        DEADLINE_S,
        "the first answer",
        check=d.check_alive,
    )

    # A message enqueued without a wake: only a sweep can find it.
    client.store.enqueue(thread_id, new_message_id(), UserMessage(text="two"), Priority.BACKGROUND)
    wait_until(
        lambda: client.history(thread_id)[-1:] == [AssistantTurn(text="seen 2")],
        DEADLINE_S,
        "a sweep to re-drive the thread",
        check=d.check_alive,
    )
    # Beat sweeps itself (celery/beat_sweep.py): a quiet pass is a DEBUG line of beat's,
    # the one that re-drove the thread an INFO line; no sweep reaches a worker or Flower.
    wait_until(
        lambda: beat.log().count("sweep: nothing to do") >= 10,
        DEADLINE_S,
        "beat to sweep ten times",
        check=d.check_alive,
    )
    assert "INFO/MainProcess] sweep: woke 1 thread" in beat.log(), beat.log()
    assert "Sending due task dormant.sweep" not in beat.log()
    tasks = flower.tasks() or {}
    assert _of_thread(tasks, "dormant.slice", thread_id), tasks
    assert not [t for t in tasks.values() if _is(t, "dormant.sweep")], tasks
    assert 'task="dormant.sweep"' not in flower.metrics()
    log = worker.log()
    assert "dormant.sweep[" not in log and "sweep: " not in log, log


@pytest.mark.timeout(300)
def test_flower_needs_no_agents_but_a_worker_without_them_exits_saying_so(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_AGENTS="")
    d.expected_deaths.add("w1")
    worker = _start_worker(d, "w1", "info")
    wait_until(lambda: not worker.alive(), DEADLINE_S, "the worker without agents to exit")
    assert worker.popen.returncode != 0
    assert re.search(r"a worker cannot start: no agents: set DORMANT_AGENTS", worker.log())
    flower = _start_flower(d)
    assert flower.tasks() == {}
