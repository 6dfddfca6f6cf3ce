"""The model protocol: one buffered completion over a thread's history."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from dormant.messages import Item, ToolCall, Usage
from dormant.rate_limit import ProviderLimits

__all__ = [
    "TOOL_CHOICE_MODES",
    "ChunkSink",
    "Completion",
    "Model",
    "ModelRequest",
    "ModelSettings",
    "ToolChoice",
    "ToolSpec",
]

ChunkSink = Callable[[str], None]
"""Receives streamed text as it arrives; live only, never stored."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as offered to a model: name, description, JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


ToolChoice = str
"""``"auto"`` (the model decides), ``"none"`` (no tool calls), ``"required"`` (at least one
call), or any other string: the name of the one tool the model must call."""

TOOL_CHOICE_MODES = ("auto", "none", "required")


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """Per-request options, mapped by each model onto its provider's parameters.

    ``tool_choice`` (see ``ToolChoice``) and ``parallel_tool_calls`` are sent only when
    tools are offered; ``None`` leaves the provider's default (``OpenAIModel`` keeps its
    own ``parallel_tool_calls`` then). ``extra_body`` is merged into the request's JSON
    body as is, for provider-specific fields dormant does not model (its keys win).

    ``tool_choice`` is sent only with the first completion after each user message (a
    thread's first, for a child or event thread): sent on every request, ``"required"``
    would make the model call a tool on every turn for ever. ``tool_choice_every_turn``
    sends it on every request instead.
    """

    temperature: float | None = None
    max_tokens: int | None = None
    timeout_s: float = 120.0
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    tool_choice_every_turn: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelRequest:
    thread_id: str
    instructions: str
    items: Sequence[Item]
    tools: Sequence[ToolSpec]
    settings: ModelSettings = field(default_factory=ModelSettings)


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole turn: nothing of it is stored until the stream has completed."""

    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    limits: ProviderLimits | None = None
    """What the provider's response headers said about its rate limits (admission)."""


@runtime_checkable
class Model(Protocol):
    """Anything that turns a request into one complete turn.

    Implementations raise ``ModelRetryable`` for failures worth retrying (rate limits,
    5xx, dropped streams) and ``ModelFatal`` otherwise; the caller owns the retry policy.
    """

    name: str
    context_window: int

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion: ...
