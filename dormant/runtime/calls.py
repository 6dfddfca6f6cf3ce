"""Step 6 of the slice: validate each call of a turn and start it.

A call to the reserved event name, to an unknown tool or with arguments that fail the
tool's schema is answered at once with an error result (the model is asked again); a
built-in is applied as a pure state change; any other tool gets an outbox row, so it is
dispatched after the commit. When the budget stops the slice before the model reads the
results it answered so, ``hold_back`` queues them instead (``runtime/budgets.py``).
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from dormant.agents import Agent
from dormant.messages import EVENT_TOOL_NAME, ParentMessage, ToolCall, ToolResult, ToolResultMessage
from dormant.replay.agent import serve
from dormant.runtime.approvals import ask_approval
from dormant.runtime.children import close_thread, report_to_parent, spawn_child
from dormant.runtime.history import Applied
from dormant.runtime.turn import Turn
from dormant.stores.base import CallRecord, CallState, NewTimer, Priority, StoredItem
from dormant.tools.builtins import (
    Answer,
    BuiltinContext,
    Close,
    MessageChild,
    Report,
    Spawn,
    StartTimer,
    Wait,
    run_builtin,
)

__all__ = ["fresh_ids", "hold_back", "start_call"]


def start_call(
    agent: Agent,
    call: ToolCall,
    seq: int,
    applied: Applied,
    turn: Turn,
    ctx: BuiltinContext,
) -> ToolResult | None:
    """Record ``call``; its result if the slice answers it now, else None (pending)."""

    def record(state: CallState, *, subscription: bool = False, passive: bool = False) -> None:
        applied.calls[call.call_id] = CallRecord(
            call.call_id, call.name, call.args, seq, state, subscription, passive
        )
        applied.changed.add(call.call_id)

    def answer(
        content: str, is_error: bool = False, state: CallState = CallState.ANSWERED
    ) -> ToolResult:
        record(state, subscription=state is CallState.SUBSCRIBED)
        return ToolResult(call_id=call.call_id, name=call.name, content=content, is_error=is_error)

    tool = agent.tool(call.name)
    if call.name == EVENT_TOOL_NAME:
        return answer(
            f"Error: you cannot call {EVENT_TOOL_NAME}; events are delivered to you "
            "automatically as its results.",
            is_error=True,
        )
    if tool is None:
        available = ", ".join(s.name for s in agent.specs())
        return answer(
            f"Error: tool {call.name!r} does not exist. Available tools: {available}.",
            is_error=True,
        )
    error = tool.error_for(call.args)
    if error is not None:
        return answer(error, is_error=True)
    served = serve(agent, call, tool, applied.calls)  # a replay answers from its record
    if served is not None:
        if served.held:  # answered by the next fed input, as the source's was
            record(CallState.PENDING, subscription=tool.subscription, passive=tool.passive)
            return None
        turn.closing = turn.closing or served.stop
        # A subscription's recorded events, a spawn's recorded reports are fed to it.
        return answer(served.content, served.is_error, state=_subscribed_if(served.subscribed))
    if not tool.builtin:
        record(CallState.PENDING, subscription=tool.subscription)
        if not ask_approval(agent, tool, call, ctx.thread, turn, applied, ctx.now):
            turn.outbox.append((call.call_id, "tool"))
        return None
    thread = ctx.thread
    match run_builtin(call.name, tool.validate(call.args), ctx):
        case Answer(content=content, is_error=is_error, cancel_call_id=cancel):
            if cancel is not None:
                applied.set_state(applied.calls[cancel], CallState.CANCELLED)
                turn.outbox.append((cancel, "cancel"))
            return answer(content, is_error)
        case StartTimer(due_at=due_at, content=content):
            record(CallState.PENDING, passive=True)
            message = ToolResultMessage(call_id=call.call_id, content=content)
            turn.timers.append(NewTimer(call.call_id, due_at, f"timer:{call.call_id}", message))
        case Wait():
            record(CallState.PENDING, passive=True)
        case Spawn(instructions=instructions):
            child = spawn_child(agent, thread, call, seq, instructions, turn)
            return answer(
                f"Child thread {child} started. Its reports will reach you as events on this call.",
                state=CallState.SUBSCRIBED,
            )
        case Report(content=content):
            report_to_parent(
                thread,
                f"Report from child thread {thread.id}: {content}",
                call,
                final=False,
                turn=turn,
            )
            return answer("Report sent to the parent thread.")
        case Close(report=report):
            close_thread(thread, applied, turn, call, report)
            return answer("Thread closed.")
        case MessageChild(child=child, content=content):
            note = ParentMessage(
                call_id=child.parent_call_id or "",
                content=f"Message from the parent thread: {content}",
            )
            turn.enqueue.append((child.id, f"parent:{call.call_id}", note, Priority.BACKGROUND))
            return answer(f"Message sent to child thread {child.id}.")
    return None


def _subscribed_if(live: bool) -> CallState:
    return CallState.SUBSCRIBED if live else CallState.ANSWERED


def fresh_ids(calls: tuple[ToolCall, ...], known: dict[str, CallRecord]) -> tuple[ToolCall, ...]:
    """The calls with an empty or reused id given a fresh one, so each id has one result."""
    seen = set(known)
    fresh = []
    for call in calls:
        if not call.call_id or call.call_id in seen:
            call = call.model_copy(update={"call_id": f"call_{uuid.uuid4().hex[:24]}"})
        seen.add(call.call_id)
        fresh.append(call)
    return tuple(fresh)


def hold_back(thread_id: str, answered: list[StoredItem], applied: Applied, turn: Turn) -> None:
    """Move the results the slice just gave (the tail of ``turn``) to the thread's own
    inbox, their calls pending again: the budget stopped the slice before its model read
    them. Kept as items, nothing would be queued, so after ``raise_budget`` or ``retry``
    no slice would ever show them to the model (a child that reported would never get to
    close). Queued, the thread stalls like one waiting for a tool's result, and its next
    slice applies them and asks the model. What the calls did (a report sent, a child
    spawned) is committed with the turn as usual."""
    if not answered:
        return
    tail = len(turn.items) - len(answered)
    assert turn.items[tail:] == answered, "the answered results are the turn's last items"
    del turn.items[tail:]
    for stored in answered:
        result = stored.item
        assert isinstance(result, ToolResult)
        call = applied.calls[result.call_id]
        applied.calls[call.call_id] = replace(call, state=CallState.PENDING)
        message = ToolResultMessage(
            call_id=result.call_id, content=result.content, is_error=result.is_error
        )
        turn.enqueue.append((thread_id, stored.message_id, message, Priority.BACKGROUND))
