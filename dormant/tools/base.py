"""Tools: ``@tool`` derives a JSON schema from type hints and the docstring (pydantic)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from dormant.errors import InvalidToolArguments
from dormant.models.base import ToolSpec
from dormant.tools.approval import ApprovalRule

__all__ = ["Tool", "ToolContext", "ToolSink", "tool"]


class ToolSink(Protocol):
    """Where a running tool sends what it produces (the system that dispatched it)."""

    def tool_result(
        self, thread_id: str, call_id: str, content: str, *, is_error: bool = False
    ) -> None: ...

    def tool_event(
        self,
        thread_id: str,
        call_id: str,
        content: str,
        *,
        associative: bool,
        final: bool,
        message_id: str | None,
    ) -> None: ...

    def tool_schedule(self, thread_id: str, call_id: str, content: str, at: datetime) -> None: ...


@dataclass(frozen=True)
class ToolContext:
    """What a running tool knows about its call; ``call_id`` is its idempotency key."""

    thread_id: str
    call_id: str
    callback_url: str
    _sink: ToolSink = field(repr=False)

    def send_result(self, content: str, *, is_error: bool = False) -> None:
        """Answer this call (a deferred tool's result); later sends are duplicates."""
        self._sink.tool_result(self.thread_id, self.call_id, content, is_error=is_error)

    def send_event(
        self,
        content: str,
        *,
        associative: bool = False,
        final: bool = False,
        message_id: str | None = None,
    ) -> None:
        """Send an event on this subscription; ``message_id`` makes redelivery harmless."""
        self._sink.tool_event(
            self.thread_id,
            self.call_id,
            content,
            associative=associative,
            final=final,
            message_id=message_id,
        )

    def schedule(self, message: str, at: datetime) -> None:
        """Deliver ``message`` as an event on this call at ``at`` (a durable timer)."""
        self._sink.tool_schedule(self.thread_id, self.call_id, message, at)


@dataclass(frozen=True)
class Tool:
    """A tool the model may call.

    ``fn`` runs off the slice (a dispatcher thread or a ``dormant.tool`` task). A plain
    tool's return value or exception becomes its result; a ``deferred`` tool's result
    arrives later through its callback; a ``subscription`` tool's first result starts a
    stream of events. ``passive`` calls do not defer events (the built-in waits).
    """

    name: str
    description: str
    arguments: type[BaseModel]
    fn: Callable[..., Any] | None = None
    context_param: str | None = None
    deferred: bool = False
    subscription: bool = False
    passive: bool = False
    builtin: bool = False
    on_cancel: Callable[[ToolContext], None] | None = None
    aliases: tuple[str, ...] = ()
    """Earlier names of this tool: a stored call to one of them runs this tool."""
    upgrade_args: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """Turns arguments stored under an earlier signature into this one's; applied to every
    call's arguments before they are validated (a current call's must pass unchanged)."""
    approval: ApprovalRule = None
    """Whether a call waits for a person's decision before it runs (``docs/approvals.md``):
    True, an ``Approval`` policy, or None/False."""
    side_effect_free: bool = False
    """The tool changes nothing outside dormant (a lookup, a computation): a replay may run
    it live when the record has no result for a call (``ReplayTools(on_miss="live")``).
    Every other tool (HTTP and MCP tools included) is never run by a replay."""

    @property
    def names(self) -> tuple[str, ...]:
        """The names a call may use for this tool: its own, then its aliases."""
        return (self.name, *self.aliases)

    @functools.cached_property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments (built once: it is offered on every request)."""
        return _clean_schema(self.arguments.model_json_schema())

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def validate(self, args: dict[str, Any]) -> BaseModel:
        """The arguments as a model; raises ``pydantic.ValidationError``."""
        return self.arguments.model_validate(args)

    def error_for(self, args: dict[str, Any]) -> str | None:
        """A readable error for invalid ``args``, or None when they fit the schema."""
        try:
            self.validate(args)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in error.errors()
            )
            return f"Error: invalid arguments for tool {self.name!r}: {problems}"
        return None

    def invoke(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        """Run ``fn`` with validated arguments (and the context, if it asks for one)."""
        if self.fn is None:
            raise TypeError(f"tool {self.name!r} has no function to run")
        if self.upgrade_args is not None:
            args = self.upgrade_args(dict(args))
        error = self.error_for(args)
        if error is not None:
            raise InvalidToolArguments(error.removeprefix("Error: "))
        values = dict(self.validate(args))
        if self.context_param:
            values[self.context_param] = ctx
        return self.fn(**values)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    deferred: bool = False,
    subscription: bool = False,
    on_cancel: Callable[[ToolContext], None] | None = None,
    aliases: Sequence[str] = (),
    upgrade_args: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    approval: ApprovalRule = None,
    side_effect_free: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    deferred: bool = False,
    subscription: bool = False,
    on_cancel: Callable[[ToolContext], None] | None = None,
    aliases: Sequence[str] = (),
    upgrade_args: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    approval: ApprovalRule = None,
    side_effect_free: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function a tool: ``@tool`` or ``@tool(deferred=True)`` etc.

    ``aliases`` are the tool's earlier names (a rename): calls stored under them, made
    before a deploy, still run it. ``upgrade_args`` maps arguments stored under an earlier
    signature to the current one (``docs/upgrades.md``). ``approval`` holds each call for a
    person's decision (``Approval``, ``docs/approvals.md``). ``side_effect_free=True``
    declares that running it changes nothing outside dormant, so a replay may run it live
    (``docs/forks.md``)."""

    def make(f: Callable[..., Any]) -> Tool:
        arguments, context_param = _arguments_model(f)
        return Tool(
            name=name or f.__name__,
            description=inspect.getdoc(f) or "",
            arguments=arguments,
            fn=f,
            context_param=context_param,
            deferred=deferred,
            subscription=subscription,
            on_cancel=on_cancel,
            aliases=tuple(aliases),
            upgrade_args=upgrade_args,
            approval=approval,
            side_effect_free=side_effect_free,
        )

    return make(fn) if fn is not None else make


def arguments_model(name: str, fields: dict[str, Any]) -> type[BaseModel]:
    """A strict arguments model named after the tool (used by built-ins too)."""
    # Built on first validation: the built-ins' models would otherwise cost every import.
    config = ConfigDict(extra="forbid", defer_build=True)
    return create_model(f"{name}_arguments", __config__=config, **fields)


def _arguments_model(f: Callable[..., Any]) -> tuple[type[BaseModel], str | None]:
    hints = get_type_hints(f)
    fields: dict[str, Any] = {}
    context_param = None
    for param in inspect.signature(f).parameters.values():
        annotation = hints.get(param.name, Any)
        if annotation is ToolContext:
            context_param = param.name
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    return arguments_model(f.__name__, fields), context_param


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's titles: they cost tokens and tell the model nothing."""
    cleaned: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs"):
            value = {k: _clean_schema(v) for k, v in value.items()}
        elif isinstance(value, dict):
            value = _clean_schema(value)
        elif isinstance(value, list):
            value = [_clean_schema(v) if isinstance(v, dict) else v for v in value]
        cleaned[key] = value
    return cleaned
