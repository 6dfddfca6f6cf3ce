"""Tools: the protocol, ``@tool``, the context and the built-ins."""

from dormant.tools.base import Tool, ToolContext, tool

__all__ = ["Tool", "ToolContext", "tool"]
