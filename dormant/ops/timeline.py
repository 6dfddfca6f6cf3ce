"""Readable one-line renderings of history items and events (demo, ``dormant show``)."""

from __future__ import annotations

import json

from rich.text import Text

from dormant.messages import (
    EVENT_TOOL_NAME,
    ApprovalDecision,
    ApprovalRequest,
    AssistantTurn,
    Event,
    EventShown,
    Item,
    ItemAdded,
    Rejected,
    StatusChanged,
    Summary,
    ToolCall,
    ToolDispatched,
    ToolResult,
    UserText,
)

__all__ = ["render_event", "render_item"]


def _short(text: str, limit: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _call(call: ToolCall) -> str:
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in call.args.items())
    return f"{call.name}({_short(args, 60)})"


def render_item(item: Item) -> Text:
    """One styled line (or a few) for a stored history item."""
    match item:
        case UserText(text=text):
            return Text.assemble(("user      ", "bold cyan"), _short(text))
        case AssistantTurn(text=text, calls=calls):
            line = Text.assemble(("assistant ", "bold green"), _short(text) if text else "")
            for c in calls:
                line.append(f"\n          → {_call(c)}", style="yellow")
                line.append(f"  [{c.call_id}]", style="dim")
            return line
        case ToolResult(name=name, content=content, is_error=is_error):
            style = "red" if is_error else "magenta"
            return Text.assemble(("result    ", f"bold {style}"), f"{name}: {_short(content)}")
        case EventShown(original_name=name, original_call_id=call_id, content=content):
            return Text.assemble(
                ("event     ", "bold blue"),
                f"{name} [{call_id}]: {_short(content)}",
                (f"  (shown as {EVENT_TOOL_NAME})", "dim"),
            )
        case Summary(text=text, upto_seq=upto):
            return Text.assemble(("summary   ", "bold white"), f"up to #{upto}: {_short(text)}")
        case ApprovalRequest(call_id=call_id, name=name, args=args, digest=digest):
            call = _call(ToolCall(call_id=call_id, name=name, args=args))
            return Text.assemble(
                ("approval? ", "bold yellow"), f"{call} [{call_id}]", (f"  digest {digest}", "dim")
            )
        case ApprovalDecision() as made:
            edited = f" args={json.dumps(made.args)}" if made.args is not None else ""
            why = f": {_short(made.reason, 60)}" if made.reason else ""
            return Text.assemble(
                ("decided   ", "bold yellow"),
                f"{made.decision} [{made.call_id}] by {made.by} via {made.channel}{why}{edited}",
                (f"  at {made.decided_at.isoformat(timespec='seconds')}", "dim"),
            )
    raise TypeError(f"not a history item: {item!r}")


def render_event(event: Event) -> Text | None:
    """A line for a live event, or None for events not worth a line (chunks)."""
    match event:
        case ItemAdded(seq=seq, item=item):
            return Text.assemble((f"#{seq:<3} ", "dim"), render_item(item))
        case ToolDispatched(name=name, call_id=call_id):
            return Text(f"     dispatched {name} [{call_id}]", style="dim")
        case Rejected(message_id=message_id, reason=reason):
            return Text.assemble(("     rejected  ", "bold red"), f"{message_id}: {reason}")
        case StatusChanged(status=status, detail=detail):
            return Text(f"     thread is {status}{': ' + detail if detail else ''}", style="dim")
    return None
