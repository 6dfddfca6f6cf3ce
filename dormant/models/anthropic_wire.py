"""dormant's history and tools as Anthropic Messages JSON (pure functions).

The Messages API wants strictly alternating roles starting with ``user``, so consecutive
parts of one role are merged into one message: an assistant turn's text and its
``tool_use`` blocks, several ``tool_result`` blocks, and user text after results (results
come first, as the API requires). Empty text blocks are never sent (the API refuses them).
Tool-use ids are restricted to ``[A-Za-z0-9_-]``; ids from other providers are made to
fit, the same way in the call and its result.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from dormant.messages import Item
from dormant.models.base import ToolChoice, ToolSpec
from dormant.models.wire import Answered, Called, Said, flatten, offered_tools

__all__ = ["OPENING_TEXT", "messages", "tool_choice", "tool_use_id", "tools"]

Message = dict[str, Any]
Block = dict[str, Any]

OPENING_TEXT = "(The conversation so far follows.)"
"""A first user message, only for a history that would otherwise open with the assistant."""

_NOT_ID = re.compile(r"[^A-Za-z0-9_-]")


def messages(items: Sequence[Item]) -> list[Message]:
    """The ``messages`` array for ``items``; the instructions go in ``system`` instead."""
    out: list[Message] = []
    for part in flatten(items):
        role, block = _block(part)
        if out and out[-1]["role"] == role:
            out[-1]["content"].append(block)
        else:
            out.append({"role": role, "content": [block]})
    if out and out[0]["role"] == "assistant":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": OPENING_TEXT}]})
    return out


_ANTHROPIC_MODES = {"auto": "auto", "none": "none", "required": "any"}


def tool_choice(choice: ToolChoice | None, parallel: bool | None) -> dict[str, Any] | None:
    """``tool_choice``: ``{"type": "auto"|"any"|"tool"|"none", "name"?,
    "disable_parallel_tool_use"?}``; None when neither option is set.

    Anthropic has no separate parallel switch: turning parallel calls off is a flag on
    the choice (``auto`` when no choice is given). ``none`` takes no flag.
    """
    if choice is None and parallel is None:
        return None
    out: dict[str, Any]
    if choice is None or choice in _ANTHROPIC_MODES:
        out = {"type": _ANTHROPIC_MODES[choice or "auto"]}
    else:
        out = {"type": "tool", "name": choice}
    if parallel is not None and out["type"] != "none":
        out["disable_parallel_tool_use"] = not parallel
    return out


def tools(specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """The ``tools`` array, never the reserved event name."""
    out: list[dict[str, Any]] = []
    for spec in offered_tools(specs):
        tool: dict[str, Any] = {"name": spec.name, "input_schema": spec.parameters}
        if spec.description:
            tool["description"] = spec.description
        out.append(tool)
    return out


def tool_use_id(call_id: str) -> str:
    """``call_id`` as a valid ``tool_use`` id (unchanged when it already is one)."""
    return _NOT_ID.sub("_", call_id) or "call"


def _block(part: Said | Called | Answered) -> tuple[Literal["user", "assistant"], Block]:
    match part:
        case Said(role=role, text=text):
            return role, {"type": "text", "text": text}
        case Called(call=call):
            block = {"type": "tool_use", "id": tool_use_id(call.call_id), "name": call.name}
            return "assistant", {**block, "input": call.args}
        case Answered(call_id=call_id, content=content, is_error=is_error):
            result: Block = {"type": "tool_result", "tool_use_id": tool_use_id(call_id)}
            if content:
                result["content"] = content
            if is_error:
                result["is_error"] = True
            return "user", result
