"""Built-in tools, run inside the slice as pure state changes (no I/O).

Each handler returns an ``Effect`` the slice applies in its commit: an immediate answer,
a durable timer, or nothing (the call waits). External side effects (a subscription's
cancel hook) go through the outbox like any tool dispatch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import BaseModel, Field

from dormant.stores.base import CallRecord, CallState, ThreadInfo, ThreadStatus
from dormant.tools.base import Tool, arguments_model

__all__ = [
    "BUILTINS",
    "THREAD_TOOLS",
    "Answer",
    "BuiltinContext",
    "Close",
    "Effect",
    "MessageChild",
    "Report",
    "Spawn",
    "StartTimer",
    "Wait",
    "offered_builtins",
    "run_builtin",
]

MAX_SLEEP_S = 366 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Answer:
    content: str
    is_error: bool = False
    cancel_call_id: str | None = None
    """A subscription to cancel (its tool's cancel hook runs through the outbox)."""


@dataclass(frozen=True, slots=True)
class StartTimer:
    due_at: datetime
    content: str


@dataclass(frozen=True, slots=True)
class Wait:
    """The call stays pending until something else answers it (an event)."""


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start a child thread that inherits this history up to the spawning turn."""

    instructions: str


@dataclass(frozen=True, slots=True)
class Report:
    """Send a report to the parent, shown there as an event on the spawn call."""

    content: str


@dataclass(frozen=True, slots=True)
class Close:
    """Close this thread (and its descendants), reporting to the parent if there is one."""

    report: str | None


@dataclass(frozen=True, slots=True)
class MessageChild:
    child: ThreadInfo
    content: str


Effect = Answer | StartTimer | Wait | Spawn | Report | Close | MessageChild


@dataclass(frozen=True, slots=True)
class BuiltinContext:
    thread: ThreadInfo
    calls: Mapping[str, CallRecord]
    children: Callable[[], Sequence[ThreadInfo]]
    """The thread's children, read only by the tools that need them."""
    now: datetime


Handler = Callable[[Any, BuiltinContext], Effect]
_HANDLERS: dict[str, Handler] = {}
BUILTINS: dict[str, Tool] = {}


def _builtin(
    name: str, description: str, fields: dict[str, Any], *, passive: bool = False
) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        BUILTINS[name] = Tool(
            name=name,
            description=description,
            arguments=arguments_model(name, fields),
            passive=passive,
            builtin=True,
        )
        _HANDLERS[name] = handler
        return handler

    return register


THREAD_TOOLS = frozenset({"spawn_thread", "send_message_to_child"})
"""Offered (and callable) only by agents created with ``threads=True``."""
CHILD_TOOLS = frozenset({"report_to_parent", "close_thread"})


def offered_builtins(*, threads: bool, child: bool, subscribed: bool) -> list[str]:
    """The built-ins worth their tokens in this situation, in a stable order.

    Every offered schema is paid for on every request, so a tool is offered only where
    it can succeed: the child tools in child threads, ``cancel_subscription`` while a
    subscription is open, the thread tools when the agent enables them. The waits are
    always offered (a root thread may sleep on a schedule with nothing open).
    """
    return [
        name
        for name in BUILTINS
        if (name not in THREAD_TOOLS or threads)
        and (name not in CHILD_TOOLS or child)
        and (name != "cancel_subscription" or subscribed)
    ]


def run_builtin(name: str, args: BaseModel, ctx: BuiltinContext) -> Effect:
    return _HANDLERS[name](args, ctx)


@_builtin(
    "sleep",
    "Pause for a number of seconds without holding any resources; you are woken early if "
    "an event arrives.",
    {"seconds": (Annotated[float, Field(ge=0, le=MAX_SLEEP_S)], ...)},
    passive=True,
)
def _sleep(args: Any, ctx: BuiltinContext) -> Effect:
    return StartTimer(
        ctx.now + timedelta(seconds=args.seconds), f"Slept for {args.seconds:g} seconds."
    )


@_builtin(
    "sleep_until",
    "Pause until an ISO 8601 time (UTC if no offset is given); you are woken early if an "
    "event arrives.",
    {"iso_time": (str, ...)},
    passive=True,
)
def _sleep_until(args: Any, ctx: BuiltinContext) -> Effect:
    try:
        due = datetime.fromisoformat(args.iso_time)
    except ValueError:
        return Answer(f"Error: {args.iso_time!r} is not an ISO 8601 time", is_error=True)
    due = due if due.tzinfo else due.replace(tzinfo=UTC)
    if due - ctx.now > timedelta(seconds=MAX_SLEEP_S):
        return Answer(f"Error: {args.iso_time!r} is more than a year away", is_error=True)
    return StartTimer(max(due, ctx.now), f"Woke up at the target time {due.isoformat()}.")


@_builtin(
    "wait_for_event",
    "Wait, holding no resources, until an event arrives on one of your subscriptions.",
    {},
    passive=True,
)
def _wait_for_event(args: Any, ctx: BuiltinContext) -> Effect:
    return Wait()


@_builtin(
    "cancel_subscription",
    "Stop a subscription you started; its later events are refused.",
    {"call_id": (str, Field(description="The call id of the subscription tool call."))},
)
def _cancel_subscription(args: Any, ctx: BuiltinContext) -> Effect:
    call = ctx.calls.get(args.call_id)
    if call is None or not call.subscription:
        return Answer(f"Error: {args.call_id!r} is not one of your subscriptions", is_error=True)
    if call.state is CallState.CANCELLED:
        return Answer(f"Error: subscription {args.call_id!r} is already cancelled", is_error=True)
    if call.state is CallState.PENDING:
        # Its first result has not arrived: cancelling now would leave the call unanswered.
        return Answer(f"Error: subscription {args.call_id!r} has not started yet", is_error=True)
    return Answer(f"Subscription {args.call_id!r} cancelled.", cancel_call_id=call.call_id)


@_builtin(
    "spawn_thread",
    "Start a child thread that knows this conversation so far and works on `instructions` "
    "in parallel with you. Its reports reach you as events on this call.",
    {"instructions": (Annotated[str, Field(min_length=1)], ...)},
)
def _spawn_thread(args: Any, ctx: BuiltinContext) -> Effect:
    return Spawn(args.instructions)


@_builtin(
    "report_to_parent",
    "Send a report to the thread that spawned you; it sees it as an event.",
    {"report": (Annotated[str, Field(min_length=1)], ...)},
)
def _report_to_parent(args: Any, ctx: BuiltinContext) -> Effect:
    if ctx.thread.parent_id is None:
        return Answer("Error: this is a root thread; it has no parent to report to", is_error=True)
    return Report(args.report)


@_builtin(
    "close_thread",
    "Finish this child thread, optionally with a final report to the parent. Closing also "
    "closes your own children and cancels your subscriptions.",
    {"report": (str | None, None)},
)
def _close_thread(args: Any, ctx: BuiltinContext) -> Effect:
    if ctx.thread.parent_id is None:
        return Answer(
            "Error: the root thread cannot close itself; it stays open for the user", is_error=True
        )
    return Close(args.report)


@_builtin(
    "send_message_to_child",
    "Send a message to one of your child threads; it sees it as an event.",
    {"thread_id": (str, ...), "message": (Annotated[str, Field(min_length=1)], ...)},
)
def _send_message_to_child(args: Any, ctx: BuiltinContext) -> Effect:
    child = next((c for c in ctx.children() if c.id == args.thread_id), None)
    if child is None:
        return Answer(f"Error: {args.thread_id!r} is not a child of this thread", is_error=True)
    if child.status is ThreadStatus.CLOSED:
        return Answer(f"Error: child thread {args.thread_id!r} is closed", is_error=True)
    return MessageChild(child, args.message)
