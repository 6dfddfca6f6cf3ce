"""The code after a rolling deploy, for ``test_celery_deploys.py``: ``triage`` calls a new
tool, ``scan``, and there is a new agent, ``ops`` (``deploy_old_agents.py`` is before)."""

from __future__ import annotations

from collections.abc import Sequence

import celery_agents  # noqa: F401  (its worker_ready handler tells the test a worker is up)

from dormant import Agent, tool
from dormant.messages import Item, ToolResult
from dormant.models import Completion, ScriptedModel, call, reply

__all__ = ["AGENTS"]


@tool
def status(build: int) -> str:
    """The status of a build."""
    return f"build {build}: green"


@tool
def scan(repo: str) -> str:
    """Scan a repository for leaked secrets (new in this deploy)."""
    return f"{repo}: 0 findings"


def _triage(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, ToolResult):
        return reply(f"new code: {last.content}")
    return reply("", call("scan", repo="api"))


AGENTS = [
    Agent(
        "triage",
        model=ScriptedModel(_triage, name="scripted"),
        tools=[status, scan],
        version="v2",
    ),
    Agent("ops", model=ScriptedModel(lambda _items: reply("new code: ops"), name="scripted")),
]
