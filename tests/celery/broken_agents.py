"""An agents module whose import fails, as one listing a down MCP server does: a process that
imports it cannot start. The worker probe must answer without importing it."""

raise RuntimeError("the MCP server at http://127.0.0.1:1/mcp is down")
