"""MCP tools: the tools of a Model Context Protocol server, as ordinary dormant tools.

``mcp_tools(stdio=[...])`` or ``mcp_tools(url=...)`` lists the server's tools once, when
it is called (at agent definition, so on import of the agents module in every process),
and returns one ``Tool`` per server tool, its schema the server's own. Listing eagerly
keeps the offered schemas identical on every worker and makes a missing server a loud
``ConfigurationError`` at start-up, not an agent silently short of tools. Listing uses a
session of its own, closed at once, within ``list_timeout_s``.

Each call runs off the slice like any plain tool (a ``dormant.tool`` task, a thread
locally), in the one session the process keeps with the server (``mcp_session.py``:
started by the first call, restarted when the server dies, closed on worker shutdown),
within ``call_timeout_s``. Every failure (the server does not start, the time is up, the
connection breaks, the tool answers ``isError``) raises ``McpToolError``, which the runner
turns into an "Error: ..." result.

The ``mcp`` package is imported only here, and only when a server is contacted: install
``dormant[mcp]`` to use it.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, create_model

from dormant.errors import ConfigurationError
from dormant.tools.base import Tool, ToolContext
from dormant.tools.mcp_session import call_in_session, run_once

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp_types import CallToolResult

__all__ = ["McpServer", "McpTool", "McpToolError", "mcp_tools"]

_T = TypeVar("_T")

_ANY_ARGUMENTS: type[BaseModel] = create_model(
    "mcp_arguments", __config__=ConfigDict(extra="allow")
)
"""MCP tools carry their own JSON schema; the server validates the arguments."""


class McpToolError(Exception):
    """The MCP server failed to start or answer in time, or its tool reported an error."""


@dataclass(frozen=True)
class McpServer:
    """Where the tools live: a command (``stdio``) or a Streamable HTTP endpoint (``url``).

    ``list_timeout_s`` bounds listing the tools (start, handshake, listing) and a
    process's start of its own session; ``call_timeout_s`` bounds one call, from the
    moment the tool task runs it (waiting for that start included)."""

    stdio: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None
    list_timeout_s: float = 30.0
    call_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if bool(self.stdio) == (self.url is not None):
            raise ConfigurationError("an MCP server needs exactly one of stdio=[...] or url=...")
        for name in ("list_timeout_s", "call_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"MCP server {self.label}: {name} must be positive")

    @property
    def label(self) -> str:
        return self.url if self.url is not None else " ".join(self.stdio)

    @property
    def key(self) -> tuple[Any, ...]:
        """What makes two servers the same one (they share a session): how to reach it."""
        return (
            self.stdio,
            self.url,
            tuple(sorted((self.env or {}).items())),
            tuple(sorted((self.headers or {}).items())),
        )

    def list(self, work: Callable[[ClientSession], Awaitable[_T]]) -> _T:
        """``work`` in a session of its own, within ``list_timeout_s``."""
        try:
            return run_once(self, work, self.list_timeout_s)
        except Exception as error:
            raise self._failure("listing tools", error, self.list_timeout_s) from error

    def call(self, work: Callable[[ClientSession], Awaitable[_T]], what: str) -> _T:
        """``work`` in this process's session with the server, within ``call_timeout_s``."""
        try:
            return call_in_session(self, work)
        except Exception as error:
            raise self._failure(what, error, self.call_timeout_s) from error

    def _failure(self, what: str, error: Exception, timeout_s: float) -> McpToolError:
        if isinstance(error, TimeoutError):
            return McpToolError(
                f"{what} on MCP server {self.label!r} timed out after {timeout_s:g} s"
            )
        return McpToolError(f"{what} on MCP server {self.label!r} failed: {_describe(error)}")


@dataclass(frozen=True)
class McpTool(Tool):
    """One tool of an MCP server; ``remote_name`` is its name there."""

    server: McpServer | None = None
    remote_name: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)

    @property
    def parameters(self) -> dict[str, Any]:
        return self.input_schema

    def error_for(self, args: dict[str, Any]) -> str | None:
        """Missing required arguments; the server checks the rest (an error result)."""
        missing = [k for k in self.input_schema.get("required", ()) if k not in args]
        if missing:
            return f"Error: invalid arguments for tool {self.name!r}: missing {missing}"
        return None

    def invoke(self, args: dict[str, Any], ctx: ToolContext) -> str:
        server = self.server
        assert server is not None

        async def call(session: ClientSession) -> CallToolResult:
            return await session.call_tool(self.remote_name, args)

        result = server.call(call, f"calling {self.remote_name!r}")
        text = _text(result)
        if result.is_error:
            raise McpToolError(f"tool {self.remote_name!r} reported an error: {text}")
        return text


def mcp_tools(
    *,
    stdio: Sequence[str] = (),
    url: str | None = None,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    prefix: str = "",
    env: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    list_timeout_s: float = 30.0,
    call_timeout_s: float = 30.0,
) -> list[Tool]:
    """The server's tools (those named in ``include``, if given, less ``exclude``), named
    ``prefix + name``. Lists them now; raises ``ConfigurationError`` if the SDK is not
    installed (``dormant[mcp]``), listing fails or a name in ``include`` is not served."""
    if importlib.util.find_spec("mcp") is None:
        raise ConfigurationError(
            "mcp_tools needs the MCP SDK, which is not installed: pip install 'dormant[mcp]'"
        )
    server = McpServer(tuple(stdio), url, env, headers, list_timeout_s, call_timeout_s)
    try:
        listed = server.list(_list_tools)
    except McpToolError as error:
        raise ConfigurationError(str(error)) from error
    names = [t.name for t in listed]
    unknown = sorted(set(include or ()) - set(names))
    if unknown:
        raise ConfigurationError(
            f"MCP server {server.label!r} has no tools {unknown}; it serves {names}"
        )
    return [
        McpTool(
            name=prefix + t.name,
            description=t.description or "",
            arguments=_ANY_ARGUMENTS,
            server=server,
            remote_name=t.name,
            input_schema=t.input_schema,
        )
        for t in listed
        if (include is None or t.name in include) and t.name not in exclude
    ]


async def _list_tools(session: ClientSession) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(params=_page(cursor))
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _page(cursor: str | None) -> Any:
    if cursor is None:
        return None
    from mcp_types import PaginatedRequestParams

    return PaginatedRequestParams(cursor=cursor)


def _text(result: CallToolResult) -> str:
    """The result's text blocks joined; other blocks (images, resources) as JSON."""
    parts = [
        block.text if block.type == "text" else block.model_dump_json(exclude_none=True)
        for block in result.content
    ]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(parts)


def _describe(error: BaseException) -> str:
    """The innermost meaningful error (anyio wraps task failures in exception groups)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"
