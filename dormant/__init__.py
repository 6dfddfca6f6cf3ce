"""dormant: a durable runtime for LLM agents on Celery.

Agents are suspended at every tool call; their stored history is their continuation,
and any worker resumes them when a message arrives.

The public names load on first use (PEP 562), so ``dormant --help``, the worker's
command line and any ``dormant.x`` submodule import pay only for what they use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dormant.agents import Agent
    from dormant.approvals import Approval
    from dormant.base_client import BaseClient
    from dormant.budget import Budget
    from dormant.client import Client
    from dormant.errors import DormantError
    from dormant.local import LocalSystem
    from dormant.replay.tools import ReplayTools
    from dormant.settings import Settings
    from dormant.tools.base import Tool, ToolContext, tool

__all__ = [
    "Agent",
    "Approval",
    "BaseClient",
    "Budget",
    "Client",
    "DormantError",
    "LocalSystem",
    "ReplayTools",
    "Settings",
    "Tool",
    "ToolContext",
    "tool",
]

_HOMES = {
    "Agent": "dormant.agents",
    "Approval": "dormant.approvals",
    "BaseClient": "dormant.base_client",
    "Budget": "dormant.budget",
    "Client": "dormant.client",
    "DormantError": "dormant.errors",
    "LocalSystem": "dormant.local",
    "ReplayTools": "dormant.replay.tools",
    "Settings": "dormant.settings",
    "Tool": "dormant.tools.base",
    "ToolContext": "dormant.tools.base",
    "tool": "dormant.tools.base",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'dormant' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
