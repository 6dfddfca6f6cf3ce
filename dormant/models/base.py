"""The model protocol: one buffered completion over a thread's history."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from dormant.messages import Item, ToolCall, Usage

__all__ = ["ChunkSink", "Completion", "Model", "ModelRequest", "ModelSettings", "ToolSpec"]

ChunkSink = Callable[[str], None]
"""Receives streamed text as it arrives; live only, never stored."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as offered to a model: name, description, JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ModelSettings:
    temperature: float | None = None
    max_tokens: int | None = None
    timeout_s: float = 120.0


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


@runtime_checkable
class Model(Protocol):
    """Anything that turns a request into one complete turn.

    Implementations raise ``ModelRetryable`` for failures worth retrying (rate limits,
    5xx, dropped streams) and ``ModelFatal`` otherwise; the caller owns the retry policy.
    """

    name: str
    context_window: int

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion: ...
