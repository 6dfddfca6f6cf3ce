"""A small MCP server the tests start: stdio by default, Streamable HTTP with ``--port``."""

from __future__ import annotations

import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("dormant-test")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def fail(reason: str) -> str:
    """Always fails with ``reason``."""
    raise ToolError(reason)


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer (for timeouts)."""
    time.sleep(seconds)
    return "done"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--port":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
