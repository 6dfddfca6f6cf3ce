"""An agent with a stdio MCP tool, run on real workers (``DORMANT_AGENTS=mcp_agents``).

The server's tools are listed when this module is imported (in each worker and client);
each worker process keeps one ``tests/mcp_server.py`` running for its ``dormant.tool`` tasks.
With ``TEST_MCP_LINGER=1`` the server lingers after its stdin closes, so that only the
worker's shutdown of its session stops it (a worker killed with SIGKILL would leave it).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from celery.signals import worker_ready
from celery_agents import shared_key, worker_redis

from dormant import Agent
from dormant.messages import Item, ToolResult, UserText
from dormant.models import Completion, ScriptedModel, call, reply
from dormant.tools import mcp_tools

__all__ = ["AGENTS"]

SERVER = str(Path(__file__).resolve().parent.parent / "mcp_server.py")


def _caller(history: Sequence[Item]) -> Completion:
    """``name {args}`` calls a tool once; ``name*8 {args}`` eight times in one turn."""
    last = history[-1]
    if isinstance(last, UserText):
        name, _, args = last.text.partition(" ")
        name, _, times = name.partition("*")
        return reply("", *(call(name, **json.loads(args)) for _ in range(int(times or 1))))
    if isinstance(last, ToolResult):
        return reply(f"got: {last.content}")
    raise AssertionError(f"the MCP script has no answer to {last!r}")


mcp_caller = Agent(
    "mcp_caller",
    model=ScriptedModel(_caller),
    tools=mcp_tools(
        stdio=[
            sys.executable,
            SERVER,
            *(["--linger"] if os.environ.get("TEST_MCP_LINGER") else []),
        ],
        include=["add", "fail", "pid"],
        list_timeout_s=180,
        call_timeout_s=180,
    ),
)

AGENTS = [mcp_caller]


@worker_ready.connect  # type: ignore[untyped-decorator]
def _announce(**_: object) -> None:
    """What ``Deployment.wait_ready`` waits for (``celery_agents`` announces the same way)."""
    key = shared_key(os.environ["DORMANT_KEY_PREFIX"], "ready", os.environ["TEST_WORKER_ID"])
    worker_redis().set(key, os.getpid())
