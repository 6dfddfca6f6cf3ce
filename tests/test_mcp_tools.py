"""MCP tools on LocalSystem, against real MCP servers the tests start (tests/mcp_server.py).

The stdio server is started by each call; the Streamable HTTP server runs for the module
on a free port of 127.0.0.1. Server starts are slow on a busy machine (importing the SDK
takes seconds), so timeouts here are generous except where a timeout is the point.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from dormant import Agent, LocalSystem, Tool
from dormant.errors import ConfigurationError
from dormant.messages import Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.tools import mcp_tools
from dormant.tools.mcp import McpServer, McpTool
from tests.harness import results

SERVER = str(Path(__file__).with_name("mcp_server.py"))
STDIO = [sys.executable, SERVER]
START_S = 180.0
"""Generous: a Python MCP server takes seconds to import its SDK on a loaded machine."""


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
    tools = mcp_tools(stdio=STDIO, include=["add"], timeout_s=START_S)
    [add] = tools
    assert add.spec().name == "add" and add.spec().description == "Add two integers."
    assert add.spec().parameters["required"] == ["a", "b"]
    result = run(tools, 'add {"a": 2, "b": 3}')
    assert (result.content, result.is_error) == ("5", False)


def test_a_server_that_fails_to_start_is_an_error_result_and_a_listing_error() -> None:
    [add] = mcp_tools(stdio=STDIO, include=["add"], timeout_s=START_S)
    assert isinstance(add, McpTool)
    gone = dataclasses.replace(add, server=McpServer(stdio=("/nonexistent/mcp-server",)))
    result = run([gone], 'add {"a": 2, "b": 3}')
    assert result.is_error
    assert result.content.startswith(
        "Error: McpToolError: calling 'add' on MCP server '/nonexistent/mcp-server' failed: "
    )
    crashing = [sys.executable, "-c", "raise SystemExit(3)"]
    with pytest.raises(ConfigurationError, match=r"listing tools on MCP server .* failed"):
        mcp_tools(stdio=crashing, timeout_s=START_S)


def test_an_http_server_tool_answers_through_the_inbox(http_url: str) -> None:
    tools = mcp_tools(url=http_url, timeout_s=START_S)
    assert [t.name for t in tools] == ["add", "fail", "slow"]
    result = run(tools, 'add {"a": 40, "b": 2}')
    assert (result.content, result.is_error) == ("42", False)


def test_an_mcp_tool_error_becomes_an_error_result(http_url: str) -> None:
    result = run(mcp_tools(url=http_url, timeout_s=START_S), 'fail {"reason": "disk full"}')
    assert result.is_error
    assert result.content == (
        "Error: McpToolError: tool 'fail' reported an error: Error executing tool fail: disk full"
    )


def test_a_call_past_its_timeout_becomes_an_error_result(http_url: str) -> None:
    tools = mcp_tools(url=http_url, include=["slow"], timeout_s=START_S)
    [slow] = [dataclasses.replace(t, server=McpServer(url=http_url, timeout_s=2.0)) for t in tools]
    started = time.monotonic()
    result = run([slow], 'slow {"seconds": 3600}')
    assert result.is_error
    assert result.content == (
        f"Error: McpToolError: calling 'slow' on MCP server '{http_url}' timed out after 2 s"
    )
    assert time.monotonic() - started < 600


def test_tools_are_filtered_by_name_and_can_be_prefixed(http_url: str) -> None:
    names = [t.name for t in mcp_tools(url=http_url, exclude=["slow"], prefix="calc_")]
    assert names == ["calc_add", "calc_fail"]
    assert [t.name for t in mcp_tools(url=http_url, include=["slow", "add"])] == ["add", "slow"]
    with pytest.raises(ConfigurationError, match=r"has no tools \['mul'\]"):
        mcp_tools(url=http_url, include=["add", "mul"])


def test_a_prefixed_tool_calls_the_servers_own_name(http_url: str) -> None:
    tools = mcp_tools(url=http_url, include=["add"], prefix="calc_", timeout_s=START_S)
    result = run(tools, 'calc_add {"a": 1, "b": 1}')
    assert (result.name, result.content) == ("calc_add", "2")


def test_importing_dormant_does_not_import_the_mcp_sdk() -> None:
    code = "import sys, dormant, dormant.tools; print('mcp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
