"""Built-in tools, run inside the slice as pure state changes (no I/O).

Each handler returns an ``Effect`` the slice applies in its commit: an immediate answer,
a durable timer, or nothing (the call waits). External side effects (a subscription's
cancel hook) go through the outbox like any tool dispatch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import BaseModel, Field

from dormant.stores.base import CallRecord, CallState
from dormant.tools.base import Tool, arguments_model

__all__ = ["BUILTINS", "Answer", "BuiltinContext", "Effect", "StartTimer", "Wait", "run_builtin"]

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


Effect = Answer | StartTimer | Wait


@dataclass(frozen=True, slots=True)
class BuiltinContext:
    thread_id: str
    calls: Mapping[str, CallRecord]
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
    return StartTimer(ctx.now + timedelta(seconds=args.seconds), f"Slept for {args.seconds:g} seconds.")


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
    return Answer(f"Subscription {args.call_id!r} cancelled.", cancel_call_id=call.call_id)
