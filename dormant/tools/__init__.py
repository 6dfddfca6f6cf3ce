"""Tools: the protocol, ``@tool``, the context and the built-ins."""

from dormant.tools.base import Tool, ToolContext, tool
from dormant.tools.http import HttpToolError, http_tool

__all__ = ["HttpToolError", "Tool", "ToolContext", "http_tool", "tool"]
