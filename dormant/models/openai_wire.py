"""dormant's history and tools as OpenAI Chat Completions JSON (pure functions).

Shapes: the instructions are a ``system`` message; an assistant turn is one ``assistant``
message with ``content`` (``None`` when it only calls tools) and ``tool_calls``; each result
is a ``tool`` message with its ``tool_call_id``, right after the turn that made the call.
Chat Completions has no error flag on tool messages, so a failed result's text is prefixed
with ``Error:`` unless it already says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from dormant.messages import Item, ToolCall
from dormant.models.base import TOOL_CHOICE_MODES, ToolChoice, ToolSpec
from dormant.models.wire import Answered, Called, Said, flatten, offered_tools

__all__ = ["messages", "result_text", "tool_choice", "tools"]

Message = dict[str, Any]


def messages(instructions: str, items: Sequence[Item]) -> list[Message]:
    """The ``messages`` array for ``items``, led by the instructions as a system message."""
    out: list[Message] = [{"role": "system", "content": instructions}] if instructions else []
    for part in flatten(items):
        match part:
            case Said(role="user", text=text):
                out.append({"role": "user", "content": text})
            case Said(text=text):
                out.append({"role": "assistant", "content": text})
            case Called(call=call):
                _turn_for_call(out)["tool_calls"].append(_tool_call(call))
            case Answered() as answer:
                out.append(
                    {"role": "tool", "tool_call_id": answer.call_id, "content": result_text(answer)}
                )
    return out


def tools(specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """The ``tools`` array: one function per spec, never the reserved event name."""
    return [_function(spec) for spec in offered_tools(specs)]


def tool_choice(choice: ToolChoice) -> str | dict[str, Any]:
    """``tool_choice``: a mode as is, or the named function the model must call."""
    if choice in TOOL_CHOICE_MODES:
        return choice
    return {"type": "function", "function": {"name": choice}}


def result_text(answer: Answered) -> str:
    """A result's text; failures say so in words, the only way this API can tell."""
    if answer.is_error and not answer.content.lower().startswith("error"):
        return f"Error: {answer.content}"
    return answer.content


def _turn_for_call(out: list[Message]) -> Message:
    """The assistant message a call belongs to: the turn's text message, or a new one."""
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", [])
        return last
    turn: Message = {"role": "assistant", "content": None, "tool_calls": []}
    out.append(turn)
    return turn


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.args, ensure_ascii=False)},
    }


def _function(spec: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": spec.name, "parameters": spec.parameters}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}
