"""dormant: a durable runtime for LLM agents on Celery.

Agents are suspended at every tool call; their stored history is their continuation,
and any worker resumes them when a message arrives.
"""

from dormant.agents import Agent
from dormant.base_client import BaseClient
from dormant.client import Client
from dormant.errors import DormantError
from dormant.local import LocalSystem
from dormant.settings import Settings
from dormant.tools.base import Tool, ToolContext, tool

__all__ = [
    "Agent",
    "BaseClient",
    "Client",
    "DormantError",
    "LocalSystem",
    "Settings",
    "Tool",
    "ToolContext",
    "tool",
]
