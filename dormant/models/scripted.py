"""``ScriptedModel``: a model that is a function of the history (tests and demos)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dormant.messages import Item, ToolCall, Usage
from dormant.models.base import ChunkSink, Completion, ModelRequest

__all__ = ["Reply", "ScriptedModel", "call", "reply"]

Script = Callable[[Sequence[Item]], Completion]


def reply(text: str, *calls: ToolCall) -> Completion:
    """A completion with ``text`` and optional ``calls``: the scripts' vocabulary."""
    return Completion(
        text=text, calls=tuple(calls), usage=Usage(input_tokens=10, output_tokens=len(text) // 4)
    )


def call(name: str, call_id: str | None = None, /, **args: object) -> ToolCall:
    """A tool call for a script; ``call_id`` defaults to a fresh id chosen by the slice."""
    return ToolCall(call_id=call_id or "", name=name, args=dict(args))


Reply = Completion


@dataclass
class ScriptedModel:
    """Calls ``script(history)`` for each completion and streams its text in small chunks.

    ``requests`` records every request, so tests can assert what the model was shown.
    """

    script: Script
    name: str = "scripted"
    context_window: int = 128_000
    chunk_chars: int = 16

    def __post_init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        self.requests.append(request)
        completion = self.script(request.items)
        for start in range(0, len(completion.text), self.chunk_chars):
            on_chunk(completion.text[start : start + self.chunk_chars])
        return completion
