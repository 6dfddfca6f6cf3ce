"""What both provider wire formats share: one flat, well-formed view of a history.

``flatten`` turns history items into ``Part``s that every chat API can take: each call is
followed by exactly one result before anything else happens, events become their
synthetic call and result, summaries become user text. The provider modules
(``openai_wire``, ``anthropic_wire``) only group parts into their own message shapes.

The history rules (``dormant.runtime.history``) already answer every call before anything else
is appended; ``flatten`` still closes a call left open (a child thread that inherited its
parent's pending ``spawn_thread`` call) and turns a result with no open call into user
text, because one malformed request would otherwise fail with a 400 on every retry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dormant.messages import (
    EVENT_TOOL_NAME,
    AssistantTurn,
    EventShown,
    Item,
    Summary,
    ToolCall,
    ToolResult,
    UserText,
)
from dormant.models.base import ToolSpec

__all__ = [
    "EMPTY_USER_TEXT",
    "MISSING_RESULT",
    "RAW_ARGUMENTS",
    "SUMMARY_PREFIX",
    "Answered",
    "Called",
    "Part",
    "Said",
    "flatten",
    "offered_tools",
    "parse_arguments",
]

RAW_ARGUMENTS = "__raw_arguments__"
"""The key that carries tool-call arguments which were not a JSON object."""

SUMMARY_PREFIX = "Summary of the conversation so far: "
MISSING_RESULT = "No result: this call was still pending at this point of the conversation."
EMPTY_USER_TEXT = "(empty message)"


@dataclass(frozen=True, slots=True)
class Said:
    """Plain text from the user or the assistant."""

    role: Literal["user", "assistant"]
    text: str


@dataclass(frozen=True, slots=True)
class Called:
    """One tool call of an assistant turn (synthetic event calls included)."""

    call: ToolCall


@dataclass(frozen=True, slots=True)
class Answered:
    """The one result of the call just made."""

    call_id: str
    name: str
    content: str
    is_error: bool = False


Part = Said | Called | Answered


def parse_arguments(raw: str) -> dict[str, Any]:
    """Tool-call arguments as a dict, never raising.

    Arguments that are not a JSON object come back as ``{RAW_ARGUMENTS: raw}`` instead of
    an exception: a bad turn must not fail the completion (a retry would produce another
    one). Every tool's arguments model forbids extra keys, so the slice's validation
    (``Tool.error_for``) turns this into a readable error result and the model, seeing
    its raw text echoed back, gets to try again. Empty arguments mean no arguments.
    """
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {RAW_ARGUMENTS: raw}
    if value is None:
        return {}
    return value if isinstance(value, dict) else {RAW_ARGUMENTS: raw}


def offered_tools(tools: Iterable[ToolSpec]) -> list[ToolSpec]:
    """The tools to offer: never the reserved synthetic-event name, whatever the caller passed."""
    return [spec for spec in tools if spec.name != EVENT_TOOL_NAME]


def flatten(items: Sequence[Item]) -> list[Part]:
    """The history as parts in which every call is answered right after its turn."""
    return _Flattener().run(items)


class _Flattener:
    def __init__(self) -> None:
        self.parts: list[Part] = []
        self.open: dict[str, ToolCall] = {}

    def run(self, items: Sequence[Item]) -> list[Part]:
        for item in items:
            self._add(item)
        self._close_open_calls()
        return self.parts

    def _add(self, item: Item) -> None:
        match item:
            case UserText(text=text):
                self._say("user", text if text.strip() else EMPTY_USER_TEXT)
            case Summary(text=text):
                self._say("user", SUMMARY_PREFIX + text)
            case AssistantTurn(text=text, calls=calls):
                self._close_open_calls()
                if text.strip():
                    self.parts.append(Said("assistant", text))
                for call in calls:
                    self.parts.append(Called(call))
                    self.open[call.call_id] = call
            case EventShown() as event:
                self._close_open_calls()
                self.parts.append(Called(event.as_call()))
                self.parts.append(Answered(event.call_id, EVENT_TOOL_NAME, event.content))
            case ToolResult() as result:
                self._result(result)

    def _result(self, result: ToolResult) -> None:
        if self.open.pop(result.call_id, None) is not None:
            answer = Answered(result.call_id, result.name, result.content, result.is_error)
            self.parts.append(answer)
            return
        state = "failed" if result.is_error else "returned"
        self._say("user", f"Tool {result.name!r} (call {result.call_id}) {state}: {result.content}")

    def _say(self, role: Literal["user", "assistant"], text: str) -> None:
        self._close_open_calls()
        self.parts.append(Said(role, text))

    def _close_open_calls(self) -> None:
        for call in self.open.values():
            self.parts.append(Answered(call.call_id, call.name, MISSING_RESULT, is_error=True))
        self.open.clear()
