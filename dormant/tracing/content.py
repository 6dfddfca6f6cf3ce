"""Message content as GenAI semantic-convention attributes, only with
``Settings.trace_content`` (off by default: prompts and answers may hold personal data)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from dormant.messages import AssistantTurn, EventShown, Item, Summary, ToolResult, UserText
from dormant.models.base import Completion

__all__ = ["input_messages", "output_messages"]


def _message(item: Item) -> dict[str, Any] | None:
    """The item as the conventions' message, or None for one the model is not shown (an
    approval request)."""
    match item:
        case UserText(text=text):
            return {"role": "user", "parts": [{"type": "text", "content": text}]}
        case AssistantTurn(text=text, calls=calls):
            parts: list[dict[str, Any]] = [{"type": "text", "content": text}] if text else []
            parts += [
                {"type": "tool_call", "id": c.call_id, "name": c.name, "arguments": c.args}
                for c in calls
            ]
            return {"role": "assistant", "parts": parts}
        case ToolResult(call_id=call_id, content=content):
            return {"role": "tool", "parts": [_response(call_id, content)]}
        case EventShown(call_id=call_id, content=content):
            return {"role": "tool", "parts": [_response(call_id, content)]}
        case Summary(text=text):
            return {"role": "system", "parts": [{"type": "text", "content": text}]}
        case _:
            return None


def _response(call_id: str, content: str) -> dict[str, Any]:
    return {"type": "tool_call_response", "id": call_id, "response": content}


def input_messages(items: Iterable[Item]) -> str:
    """``gen_ai.input.messages``: the history the model was sent, as JSON."""
    messages = (_message(item) for item in items)
    return json.dumps([m for m in messages if m is not None], default=str)


def output_messages(completion: Completion, finish: str) -> str:
    """``gen_ai.output.messages``: what the model answered, as JSON."""
    turn = _message(AssistantTurn(text=completion.text, calls=completion.calls)) or {}
    return json.dumps([{**turn, "finish_reason": finish}], default=str)
