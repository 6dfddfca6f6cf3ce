"""The new code ``tests/test_deploys.py`` checks live threads against with
``dormant check --upgrade --agents tests.deploy_check_agents``: ``scan`` and the ``watch``
subscription are removed, ``lookup`` takes ``order_id`` instead of ``id``, ``ops`` is gone."""

from __future__ import annotations

from dormant import Agent, tool
from dormant.models import ScriptedModel, reply

__all__ = ["AGENTS"]


@tool
def status(build: int) -> str:
    """The status of a build."""
    return f"build {build}: green"


@tool
def lookup(order_id: int) -> str:
    """Look an order up (its argument renamed, with no upgrade_args)."""
    return f"order {order_id}"


_MODEL = ScriptedModel(lambda _items: reply("new code"))
AGENTS = [
    Agent("triage", model=_MODEL, tools=[status]),
    Agent("helpdesk", model=_MODEL, tools=[lookup]),
    Agent("watcher", model=_MODEL),
]
