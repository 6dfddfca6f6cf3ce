"""A small MCP server the tests start: stdio by default, Streamable HTTP with ``--port``.

``--linger`` keeps the process alive after its stdin closes (until a signal ends it), like
a server that ignores the end of its input: only its client's shutdown (SIGTERM to its
process group) stops it, so a test can tell that the client did shut it down.
"""

from __future__ import annotations

import argparse
import os
import signal
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


@server.tool()
def pid() -> str:
    """The server's process id (which process answered)."""
    return str(os.getpid())


@server.tool()
def environment() -> str:
    """The names of the server's environment variables, sorted, one a line."""
    return "\n".join(sorted(os.environ))


@server.tool()
def crash(note: str) -> str:
    """Append a line to the file ``note``, then exit in the middle of the call."""
    with open(note, "a") as file:
        file.write(f"{os.getpid()}\n")
    os._exit(3)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int)
    parser.add_argument("--linger", action="store_true")
    args = parser.parse_args()
    if args.port is not None:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
    else:
        server.run()
    if args.linger:
        signal.pause()
