"""Tools: the protocol, ``@tool``, the context, HTTP and MCP tools, and the built-ins."""

from dormant.tools.base import Tool, ToolContext, tool
from dormant.tools.http import HttpToolError, http_tool
from dormant.tools.mcp import McpToolError, mcp_tools

__all__ = ["HttpToolError", "McpToolError", "Tool", "ToolContext", "http_tool", "mcp_tools", "tool"]
