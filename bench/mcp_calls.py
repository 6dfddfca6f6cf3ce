"""What one MCP tool call costs: a stdio server per call (the old way) against the session
a process keeps with each server, over stdio and over Streamable HTTP, in the same run.

    python bench/mcp_calls.py [--calls 20] [--spawn-calls 5] [--out bench/results/mcp.json]

The server is ``tests/mcp_server.py`` (the SDK's ``MCPServer``), its tool ``add``. Each way
is measured as the tool task runs it (``McpTool.invoke``, or for the old way a session of
its own per call, which is what every call did before sessions were kept):

- **per call**: the median wall time of ``--calls`` calls made one after the other (after
  one warm-up call, whose cost, the server's start, is reported apart as ``first_call_s``);
- **8 at once**: the wall time of 8 calls made together from 8 threads (a worker's
  ``-c 8``);
- **CPU per call**: this process's CPU time over all those calls (the warm-up, the
  sequential ones, the 8), plus that of the stdio servers it started and reaped (the kept
  session's server is stopped before it is read, its start included), divided by their
  number; the HTTP server's own CPU is not counted.

Ratios are against the old way in the same run: wall clock on a busy machine moves a lot,
the ratio much less.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dormant.tools import mcp_tools
from dormant.tools.base import Tool, ToolContext
from dormant.tools.mcp import McpServer, McpTool
from dormant.tools.mcp_session import close_mcp_sessions, run_once

HERE = Path(__file__).resolve().parent
SERVER = str(HERE.parent / "tests" / "mcp_server.py")
START_S = 180.0
CONTEXT = ToolContext("bench", "bench", "", None)  # type: ignore[arg-type]
ARGS = {"a": 20, "b": 22}


def cpu_s() -> float:
    """CPU seconds of this process and of its reaped children so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(call: Callable[[], str], calls: int) -> dict[str, float]:
    close_mcp_sessions()
    cpu_before = cpu_s()
    started = time.perf_counter()
    assert call() == "42"
    first_s = time.perf_counter() - started
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        assert call() == "42"
        samples.append(time.perf_counter() - started)
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as threads:
        assert list(threads.map(lambda _: call(), range(8))) == ["42"] * 8
    concurrent_s = time.perf_counter() - started
    close_mcp_sessions()  # the kept server's CPU is counted once it is reaped
    return {
        "first_call_s": first_s,
        "per_call_s": statistics.median(samples),
        "eight_at_once_s": concurrent_s,
        "cpu_per_call_s": (cpu_s() - cpu_before) / (calls + 9),
    }


def kept(tool: Tool) -> Callable[[], str]:
    return lambda: str(tool.invoke(dict(ARGS), CONTEXT))


def one_session_per_call(server: McpServer) -> Callable[[], str]:
    """The old way: every call opened a session of its own (a stdio server started)."""

    async def add(session: Any) -> str:
        result = await session.call_tool("add", dict(ARGS))
        return str(result.content[0].text)

    return lambda: run_once(server, add, server.call_timeout_s)


def http_server() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    process = subprocess.Popen(
        [sys.executable, SERVER, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + START_S
    while True:
        assert process.poll() is None, f"the MCP HTTP server exited with {process.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            assert time.monotonic() < deadline, "the MCP HTTP server never listened"
            time.sleep(0.1)  # polling for readiness


def add_tool(**where: Any) -> McpTool:
    [add] = mcp_tools(**where, include=["add"], list_timeout_s=START_S, call_timeout_s=START_S)
    assert isinstance(add, McpTool) and add.server is not None
    return add


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--spawn-calls", type=int, default=5, help="calls of the old way")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "mcp.json")
    args = parser.parse_args()
    stdio = add_tool(stdio=[sys.executable, SERVER])
    process, url = http_server()
    try:
        http = add_tool(url=url)
        assert stdio.server is not None and http.server is not None
        results = {
            "stdio, a server per call (before)": measure(
                one_session_per_call(stdio.server), args.spawn_calls
            ),
            "stdio, one session per process": measure(kept(stdio), args.calls),
            "HTTP, a session per call (before)": measure(
                one_session_per_call(http.server), args.calls
            ),
            "HTTP, one session per process": measure(kept(http), args.calls),
        }
    finally:
        process.kill()
        process.wait(timeout=60)
    baseline = results["stdio, a server per call (before)"]
    for name, figures in results.items():
        figures["per_call_vs_before"] = baseline["per_call_s"] / figures["per_call_s"]
        figures["eight_at_once_vs_before"] = (
            baseline["eight_at_once_s"] / figures["eight_at_once_s"]
        )
        f = figures
        print(
            f"{name:>36}: {f['per_call_s'] * 1000:8.1f} ms a call ({f['per_call_vs_before']:6.1f}x)"
            f", 8 at once {f['eight_at_once_s']:6.2f} s ({f['eight_at_once_vs_before']:5.1f}x)"
            f", first call {f['first_call_s']:5.2f} s"
            f", CPU {f['cpu_per_call_s'] * 1000:6.1f} ms a call"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
