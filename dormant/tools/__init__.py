"""Tools: the protocol, ``@tool``, the context and the built-ins.

``http_tool`` and ``HttpToolError`` are imported on first use: ``import dormant`` reaches
this package for ``Tool`` and must not pay for httpx (whose package import also loads its
command line, click and rich).
"""

from typing import TYPE_CHECKING

from dormant.tools.base import Tool, ToolContext, tool

if TYPE_CHECKING:
    from dormant.tools.http import HttpToolError, http_tool

__all__ = ["HttpToolError", "Tool", "ToolContext", "http_tool", "tool"]


def __getattr__(name: str) -> object:
    if name in ("HttpToolError", "http_tool"):
        from dormant.tools import http

        return getattr(http, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
