"""MCP tools on LocalSystem, against real MCP servers the tests start (tests/mcp_server.py),
and against ``mcp-server-time`` from PyPI when it is installed.

A stdio server runs in the session the process keeps with it (started by the first call,
stopped when each test ends); the Streamable HTTP server runs for the module on a free port
of 127.0.0.1. Server starts are slow on a busy machine (importing the SDK takes seconds),
so timeouts here are generous except where a timeout is the point.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dormant import Agent, LocalSystem, Tool, ToolContext
from dormant.errors import ConfigurationError
from dormant.messages import Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.tools import mcp_tools
from dormant.tools.mcp import McpServer, McpTool, McpToolError
from dormant.tools.mcp_session import close_mcp_sessions
from tests.harness import results

SERVER = str(Path(__file__).with_name("mcp_server.py"))
STDIO = [sys.executable, SERVER]
START_S = 180.0
"""Generous: a Python MCP server takes seconds to import its SDK on a loaded machine."""

CONTEXT = ToolContext("thread-1", "call-1", "", None)  # type: ignore[arg-type]
"""What ``McpTool.invoke`` is given when a test calls it directly (it sends nothing)."""


@pytest.fixture(autouse=True)
def closed_sessions() -> Iterator[None]:
    """Each test starts with no MCP session, and leaves no server running."""
    yield
    close_mcp_sessions()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, SERVER, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert process.poll() is None, f"the MCP server exited with {process.returncode}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the MCP HTTP server never listened"
                time.sleep(0.1)  # polling for readiness, not waiting for work
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()  # a timed-out call may still be sleeping in it: no graceful stop
        process.wait(timeout=60)


def caller(items: Sequence[Item]) -> Completion:
    """Calls the tool the user names with the JSON arguments that follow; says the result."""
    last = items[-1]
    if isinstance(last, UserText):
        name, _, args = last.text.partition(" ")
        return reply("", call(name, **json.loads(args or "{}")))
    if isinstance(last, ToolResult):
        return reply(f"got: {last.content}")
    return reply("ok")


def run(tools: Sequence[Tool], text: str) -> ToolResult:
    """Launch ``text`` on LocalSystem with ``tools``; the one tool result it produced."""
    agent = Agent("mcp", model=ScriptedModel(caller), tools=list(tools))
    with LocalSystem([agent], "memory://") as system:
        thread_id = system.launch("mcp", text)
        system.run_until_idle(timeout_s=START_S * 2)
        [result] = results(system.history(thread_id))
    return result


def test_a_stdio_server_tool_is_listed_with_its_schema_and_called_off_the_slice() -> None:
    tools = mcp_tools(stdio=STDIO, include=["add"], list_timeout_s=START_S, call_timeout_s=START_S)
    [add] = tools
    assert add.spec().name == "add" and add.spec().description == "Add two integers."
    assert add.spec().parameters["required"] == ["a", "b"]
    result = run(tools, 'add {"a": 2, "b": 3}')
    assert (result.content, result.is_error) == ("5", False)


def test_a_server_that_fails_to_start_is_an_error_result_and_a_listing_error() -> None:
    [add] = mcp_tools(stdio=STDIO, include=["add"], list_timeout_s=START_S, call_timeout_s=START_S)
    assert isinstance(add, McpTool)
    gone = dataclasses.replace(add, server=McpServer(stdio=("/nonexistent/mcp-server",)))
    result = run([gone], 'add {"a": 2, "b": 3}')
    assert result.is_error
    assert result.content.startswith(
        "Error: McpToolError: calling 'add' on MCP server '/nonexistent/mcp-server' failed: "
    )
    crashing = [sys.executable, "-c", "raise SystemExit(3)"]
    with pytest.raises(ConfigurationError, match=r"listing tools on MCP server .* failed"):
        mcp_tools(stdio=crashing, list_timeout_s=START_S)


def test_without_the_sdk_mcp_tools_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pip install dormant`` has no ``mcp``: the error said the server failed
    (``listing tools on MCP server '...' failed: ModuleNotFoundError``), not what to install."""
    monkeypatch.setitem(sys.modules, "mcp", None)  # as if not installed
    with pytest.raises(ConfigurationError) as refused:
        mcp_tools(stdio=STDIO, list_timeout_s=START_S)
    assert str(refused.value) == (
        "mcp_tools needs the MCP SDK, which is not installed: pip install 'dormant[mcp]'"
    )


def test_an_http_server_tool_answers_through_the_inbox(http_url: str) -> None:
    tools = mcp_tools(url=http_url, list_timeout_s=START_S, call_timeout_s=START_S)
    assert [t.name for t in tools] == ["add", "fail", "slow", "pid", "environment", "crash"]
    result = run(tools, 'add {"a": 40, "b": 2}')
    assert (result.content, result.is_error) == ("42", False)


def test_an_mcp_tool_error_becomes_an_error_result(http_url: str) -> None:
    result = run(
        mcp_tools(url=http_url, list_timeout_s=START_S, call_timeout_s=START_S),
        'fail {"reason": "disk full"}',
    )
    assert result.is_error
    assert result.content == (
        "Error: McpToolError: tool 'fail' reported an error: Error executing tool fail: disk full"
    )


def test_a_call_past_its_timeout_becomes_an_error_result(http_url: str) -> None:
    tools = mcp_tools(url=http_url, include=["slow"], list_timeout_s=START_S, call_timeout_s=2.0)
    started = time.monotonic()
    result = run(tools, 'slow {"seconds": 3600}')
    assert result.is_error
    assert result.content == (
        f"Error: McpToolError: calling 'slow' on MCP server '{http_url}' timed out after 2 s"
    )
    assert time.monotonic() - started < 600


def test_tools_are_filtered_by_name_and_can_be_prefixed(http_url: str) -> None:
    names = [t.name for t in mcp_tools(url=http_url, include=["add", "fail"], prefix="calc_")]
    assert names == ["calc_add", "calc_fail"]
    names = [t.name for t in mcp_tools(url=http_url, exclude=["slow", "environment", "crash"])]
    assert names == ["add", "fail", "pid"]
    assert [t.name for t in mcp_tools(url=http_url, include=["slow", "add"])] == ["add", "slow"]
    with pytest.raises(ConfigurationError, match=r"has no tools \['mul'\]"):
        mcp_tools(url=http_url, include=["add", "mul"])


def test_a_prefixed_tool_calls_the_servers_own_name(http_url: str) -> None:
    tools = mcp_tools(
        url=http_url,
        include=["add"],
        prefix="calc_",
        list_timeout_s=START_S,
        call_timeout_s=START_S,
    )
    result = run(tools, 'calc_add {"a": 1, "b": 1}')
    assert (result.name, result.content) == ("calc_add", "2")


def test_importing_dormant_does_not_import_the_mcp_sdk() -> None:
    code = "import sys, dormant, dormant.tools; print('mcp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture(scope="module")
def stdio() -> dict[str, McpTool]:
    """The test server's tools over stdio, listed once for the module; every call of the
    module's tests goes to one server process at a time (the process's session)."""
    tools = mcp_tools(stdio=STDIO, list_timeout_s=START_S, call_timeout_s=START_S)
    return {t.name: t for t in tools if isinstance(t, McpTool)}


def invoke(tool: Tool, **args: object) -> str:
    """What a tool task does with the call: ``tool.invoke``, on this thread."""
    return str(tool.invoke(dict(args), CONTEXT))


def gone(pid: int) -> bool:
    """The process has exited and been reaped (a zombie still has its /proc entry)."""
    return not Path(f"/proc/{pid}").exists()


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling a condition, not waiting for work


def test_a_stdio_server_is_started_once_for_many_concurrent_calls(
    stdio: dict[str, McpTool],
) -> None:
    together = threading.Barrier(8)

    def call_pid(_: int) -> str:
        together.wait()
        return invoke(stdio["pid"])

    with ThreadPoolExecutor(8) as threads:
        pids = set(threads.map(call_pid, range(8)))
    assert len(pids) == 1
    assert {invoke(stdio["pid"]), run([stdio["pid"]], "pid").content} == pids


def test_a_forked_child_starts_its_own_server_and_leaves_its_parents_alone(
    stdio: dict[str, McpTool],
) -> None:
    """What a prefork worker's child does: the session it inherited is not its own."""
    parents = invoke(stdio["pid"])
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # the child answers through the pipe, whatever happens
        answer = b""
        try:
            answer = invoke(stdio["pid"]).encode()
            close_mcp_sessions()
        finally:
            os.write(write_fd, answer)
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        childs = pipe.read().decode()
    os.waitpid(child, 0)
    assert childs not in ("", parents)
    assert gone(int(childs))
    assert invoke(stdio["pid"]) == parents


def test_closing_a_local_system_stops_the_mcp_servers_of_its_process(
    stdio: dict[str, McpTool],
) -> None:
    result = run([stdio["pid"]], "pid")  # run() closes its LocalSystem
    assert not result.is_error
    assert gone(int(result.content))


def test_a_stdio_server_that_died_between_calls_is_restarted_by_the_next_call(
    stdio: dict[str, McpTool], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dormant.tools")
    first = int(invoke(stdio["pid"]))
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: "closed the connection" in caplog.text, "the session to see its end")
    second = int(invoke(stdio["pid"]))
    assert second != first
    assert int(invoke(stdio["pid"])) == second
    wait_for(lambda: gone(first), f"the killed server {first} to be reaped")


def test_a_call_in_flight_when_its_server_dies_is_an_error_and_is_not_retried(
    stdio: dict[str, McpTool], tmp_path: Path
) -> None:
    note = tmp_path / "crashes"
    first = invoke(stdio["pid"])
    with pytest.raises(
        McpToolError,
        match=r"^calling 'crash' on MCP server .* failed: MCPError: Connection closed$",
    ):
        invoke(stdio["crash"], note=str(note))
    assert note.read_text() == f"{first}\n"  # run once, by the server that died
    second = invoke(stdio["pid"])
    assert second != first
    assert invoke(stdio["pid"]) == second


def test_a_call_past_its_timeout_frees_its_thread_and_its_stuck_server_is_replaced(
    stdio: dict[str, McpTool],
) -> None:
    stuck = int(invoke(stdio["pid"]))
    slow = stdio["slow"]
    assert slow.server is not None
    impatient = dataclasses.replace(
        slow, server=dataclasses.replace(slow.server, call_timeout_s=2.0)
    )
    started = time.monotonic()
    with pytest.raises(McpToolError) as failure:
        invoke(impatient, seconds=3600)
    assert time.monotonic() - started < 2.0 + 5.0
    assert str(failure.value) == (
        f"calling 'slow' on MCP server '{slow.server.label}' timed out after 2 s"
    )
    wait_for(lambda: gone(stuck), f"the stuck server {stuck} to be stopped")
    assert int(invoke(stdio["pid"])) != stuck


def test_listing_has_its_own_timeout() -> None:
    silent = [sys.executable, "-c", "import time; time.sleep(600)"]
    started = time.monotonic()
    with pytest.raises(ConfigurationError) as failure:
        mcp_tools(stdio=silent, list_timeout_s=1.0, call_timeout_s=600)
    assert str(failure.value) == (
        f"listing tools on MCP server '{' '.join(silent)}' timed out after 1 s"
    )
    assert time.monotonic() - started < 60  # the SDK's shutdown of the server included


def test_a_stdio_server_receives_only_the_documented_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DORMANT_SECRET_KEY", "not for the server")
    [environment] = mcp_tools(
        stdio=STDIO,
        include=["environment"],
        env={"GREETING": "hello"},
        list_timeout_s=START_S,
        call_timeout_s=START_S,
    )
    names = set(invoke(environment).splitlines())
    inherited = {
        name
        for name in ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
        if name in os.environ and not os.environ[name].startswith("()")
    }
    # A Python server sets LC_CTYPE itself when it starts in the C locale (PEP 538).
    assert names - {"LC_CTYPE"} == inherited | {"GREETING"}


TIME_SERVER = Path(sys.executable).with_name("mcp-server-time")


def test_a_real_server_from_pypi_answers_concurrent_calls_in_one_session() -> None:
    if not TIME_SERVER.exists():
        pytest.skip(
            f"SKIPPED LOUDLY: mcp-server-time is not installed beside {sys.executable}, so "
            "dormant is not tested against a real MCP server from PyPI here; install it "
            "with `.uv/bin/uv pip install --python .venv/bin/python mcp-server-time`"
        )
    tools = mcp_tools(
        stdio=[str(TIME_SERVER), "--local-timezone", "UTC"],
        list_timeout_s=START_S,
        call_timeout_s=START_S,
    )
    assert sorted(t.name for t in tools) == ["convert_time", "get_current_time"]
    [convert] = [t for t in tools if t.name == "convert_time"]
    args = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
    with ThreadPoolExecutor(8) as threads:
        answers = list(threads.map(lambda _: json.loads(invoke(convert, **args)), range(8)))
    assert {a["target"]["datetime"][11:] for a in answers} == {"21:00:00+09:00"}
    result = run(tools, "convert_time " + json.dumps(args))
    assert json.loads(result.content)["time_difference"] == "+9.0h"
