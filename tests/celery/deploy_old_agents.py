"""The code before a rolling deploy, for ``test_celery_deploys.py``: ``triage`` without the
new ``scan`` tool and no ``ops`` agent (``deploy_new_agents.py`` is the code after it)."""

from __future__ import annotations

import celery_agents  # noqa: F401  (its worker_ready handler tells the test a worker is up)

from dormant import Agent, tool
from dormant.models import ScriptedModel, reply

__all__ = ["AGENTS"]


@tool
def status(build: int) -> str:
    """The status of a build."""
    return f"build {build}: green"


AGENTS = [
    Agent(
        "triage",
        model=ScriptedModel(lambda _items: reply("old code: no scan"), name="scripted"),
        tools=[status],
        version="v1",
    )
]
