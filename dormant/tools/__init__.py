"""Tools: the protocol, ``@tool``, the context, HTTP and MCP tools, and the built-ins.

``http_tool``, ``mcp_tools`` and their errors are imported on first use: ``import dormant``
reaches this package for ``Tool`` and must not pay for httpx (whose package import also
loads its command line, click and rich) or the MCP SDK.
"""

from typing import TYPE_CHECKING

from dormant.tools.base import Tool, ToolContext, tool

if TYPE_CHECKING:
    from dormant.tools.http import HttpToolError, http_tool
    from dormant.tools.mcp import McpToolError, mcp_tools

__all__ = ["HttpToolError", "McpToolError", "Tool", "ToolContext", "http_tool", "mcp_tools", "tool"]

_LAZY = {
    "HttpToolError": "dormant.tools.http",
    "http_tool": "dormant.tools.http",
    "McpToolError": "dormant.tools.mcp",
    "mcp_tools": "dormant.tools.mcp",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
