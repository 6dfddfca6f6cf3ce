"""An MCP tool on a real Celery worker: the call runs in a ``dormant.tool`` task (off the
slice) and its result, or its error, comes back through the inbox; the worker process keeps
one server for all its calls and stops it when it shuts down."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import QUEUES, Deployment, Proc, wait_until

from dormant import Client
from dormant.messages import AssistantTurn, ToolResult
from dormant.stores.base import ThreadStatus


def replied(client: Client, thread_id: str) -> bool:
    history = client.history(thread_id)
    last = history[-1] if history else None
    return isinstance(last, AssistantTurn) and last.text.startswith("got: ")


def test_an_mcp_tool_runs_in_a_tool_task_and_its_result_resumes_the_thread(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_AGENTS="mcp_agents")
    worker = d.start_worker("w1", concurrency=2)
    d.wait_ready(worker, timeout_s=240)  # importing the agents lists the server's tools
    client = d.client()

    ok = client.launch("mcp_caller", 'add {"a": 20, "b": 22}')
    bad = client.launch("mcp_caller", 'fail {"reason": "no such disk"}')

    for thread_id in (ok, bad):
        wait_until(
            lambda t=thread_id: replied(client, t),
            300,
            "the MCP call's result",
            check=d.check_alive,
        )
        assert client.thread(thread_id).status is ThreadStatus.IDLE

    [good] = [i for i in client.history(ok) if isinstance(i, ToolResult)]
    assert (good.name, good.content, good.is_error) == ("add", "42", False)
    [failed] = [i for i in client.history(bad) if isinstance(i, ToolResult)]
    assert failed.is_error
    assert failed.content == (
        "Error: McpToolError: tool 'fail' reported an error: "
        "Error executing tool fail: no such disk"
    )


def start_worker(d: Deployment, pool: str, concurrency: int) -> Proc:
    """``Deployment.start_worker``'s worker, with the pool chosen."""
    argv = ["-A", "dormant.worker", "worker", "-P", pool, "-c", str(concurrency), "-Q", QUEUES]
    argv += ["-n", f"w1.{d.prefix}@%h", "-l", "warning", "--without-heartbeat"]
    argv += ["--without-gossip", "--without-mingle"]
    return d._start("w1", argv, {"TEST_WORKER_ID": "w1"})


@pytest.mark.parametrize(("pool", "concurrency"), [("threads", 8), ("prefork", 1)])
def test_a_worker_keeps_one_mcp_server_for_concurrent_calls_and_stops_it_on_shutdown(
    deploy: Callable[..., Deployment], pool: str, concurrency: int
) -> None:
    """One server per process that runs tasks: the threads worker's (8 calls at once), or
    its prefork child's, which leaves through ``os._exit`` and so runs no ``atexit``."""
    d = deploy(DORMANT_AGENTS="mcp_agents", TEST_MCP_LINGER="1")
    worker = start_worker(d, pool, concurrency)
    d.wait_ready(worker, timeout_s=240)
    client = d.client()

    thread_id = client.launch("mcp_caller", "pid*8 {}")  # eight calls in one turn
    wait_until(lambda: replied(client, thread_id), 300, "8 MCP results", check=d.check_alive)
    answers = [i for i in client.history(thread_id) if isinstance(i, ToolResult)]
    assert len(answers) == 8 and not any(a.is_error for a in answers)
    [server_pid] = {int(a.content) for a in answers}
    assert Path(f"/proc/{server_pid}").exists()
    try:
        d.expected_deaths.add(worker.name)
        worker.popen.send_signal(signal.SIGTERM)  # a warm shutdown
        wait_until(lambda: not worker.alive(), 120, "the worker to shut down")
        assert worker.popen.returncode == 0, worker.log()
        # The server ignores the end of its stdin (TEST_MCP_LINGER): only the worker's
        # shutdown of its session stops it, and the worker reaps it before it exits (no
        # orphan, no zombie).
        assert not Path(f"/proc/{server_pid}").exists(), worker.log()
    finally:  # a failed test leaves no server behind (the pid checked to be still ours)
        with contextlib.suppress(OSError):
            if b"mcp_server.py" in Path(f"/proc/{server_pid}/cmdline").read_bytes():
                os.kill(server_pid, signal.SIGKILL)
