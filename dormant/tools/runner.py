"""Run one outbox row: a tool call off the slice, or a subscription's cancel hook.

Shared by the local dispatcher's thread pool and the ``dormant.tool`` Celery task. A
re-dispatched row is harmless: a call that is no longer pending is not run again, and
the result's message id is derived from the call id.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from dormant.agents import AgentRegistry
from dormant.approvals import notify_requested
from dormant.errors import (
    CallAnswered,
    ControlSignal,
    InvalidToolArguments,
    MessageRejected,
    NotFound,
    SubscriptionCancelled,
    ThreadClosed,
    UnknownAgent,
)
from dormant.runtime.whereabouts import Elsewhere, Whereabouts
from dormant.settings import Settings
from dormant.stores.base import CallRecord, CallState, OutboxRow, QueryStore
from dormant.stores.outages import unreachable_server
from dormant.tools.base import Tool, ToolContext, ToolSink
from dormant.tools.outcomes import (
    AlreadyAnswered,
    Answered,
    CancelHookRan,
    NotHere,
    Notified,
    Raised,
    Refused,
    Started,
    ToolOutcome,
)
from dormant.tracing import UNTRACED, start_tool

__all__ = ["RunnerStore", "as_text", "execute_outbox", "hand_in"]


class RunnerStore(QueryStore, Protocol):
    def mark_ran(self, outbox_ids: list[int]) -> None: ...


log = logging.getLogger("dormant.tools")


def as_text(value: Any) -> str:
    """A tool's return value as result text (JSON for anything but a string)."""
    if isinstance(value, str):
        return value
    if value is None:
        return "OK"
    return json.dumps(value, default=str)


def _transient(error: Exception) -> bool:
    """A server briefly unreachable (a restarting PostgreSQL or Redis): worth trying again."""
    return isinstance(error, OSError) or unreachable_server(error) is not None


_HAND_IN_BACKOFF_S = (0.2, 5.0)
"""First and longest pause between two hand-in attempts (doubling in between)."""


def hand_in(what: str, attempt: Callable[[], None], timeout_s: float) -> None:
    """Run ``attempt`` (storing a finished tool's result, or marking its row ran), trying
    again with backoff for up to ``timeout_s`` while the servers are unreachable: the tool's
    work is done and re-running it is the costly way to recover. Other errors, and the last
    transient one, are raised."""
    deadline = time.monotonic() + timeout_s
    pause_s, longest_s = _HAND_IN_BACKOFF_S
    while True:
        try:
            attempt()
            return
        except Exception as error:
            if not _transient(error) or time.monotonic() + pause_s > deadline:
                raise
            log.warning("%s: retrying in %.1f s (%s)", what, pause_s, type(error).__name__)
            time.sleep(pause_s)
            pause_s = min(longest_s, pause_s * 2)


def execute_outbox(
    row: OutboxRow,
    store: RunnerStore,
    agents: AgentRegistry,
    sink: ToolSink,
    callback_url: Callable[[str, str], str],
    crash: Callable[[str], None] = lambda _point: None,
    *,
    hand_in_timeout_s: float = 0.0,
    run: int = 1,
    max_runs: int = 3,
    whereabouts: Whereabouts | None = None,
    settings: Settings | None = None,
) -> ToolOutcome:
    """Run ``row``; every failure of the tool becomes an "Error: ..." result (never a hang).

    ``run`` is this run's number (``held_claim``): each earlier run died with its worker.
    Once ``max_runs`` died, the call is answered with why instead of starting the tool
    again, which would kill this worker too.

    A tool (or agent) this process lacks is never answered for while ``whereabouts`` says
    another worker has it or may soon: the run returns ``NotHere`` without marking the
    row, and the caller gives its claim back. Without ``whereabouts`` this process is all
    there is, and the call is answered with an error at once.

    The row is marked ran once the work is done or found unnecessary, so the sweeper
    re-dispatches only rows whose task the broker lost before any worker ran it. The
    result is handed in (and the row marked) with retries for ``hand_in_timeout_s``.
    Returns what the run did (Flower shows it). With ``settings`` the run is traced
    (``execute_tool``) when tracing is on (``dormant.tracing``).
    """
    retrying = _RetryingSink(sink, hand_in_timeout_s)
    if run > max_runs:
        outcome = _give_up(row, store, retrying, run - 1)
    else:
        found = _run(row, store, agents, retrying, callback_url, crash, whereabouts)
        outcome = _traced(found, settings, run) if isinstance(found, _Ready) else found
    if isinstance(outcome, NotHere):
        return outcome
    hand_in(f"outbox row {row.id}", lambda: store.mark_ran([row.id]), hand_in_timeout_s)
    return outcome if retrying.refused is None else Refused(retrying.refused)


class _RetryingSink:
    """The sink, with its result hand-in retried while the servers are unreachable."""

    def __init__(self, sink: ToolSink, timeout_s: float) -> None:
        self._sink = sink
        self._timeout_s = timeout_s
        self.answered = False
        """A result was handed in (a deferred tool may send its own while it runs)."""
        self.refused: str | None = None
        """Why the thread refused the result for good, if it did."""

    def tool_result(
        self, thread_id: str, call_id: str, content: str, *, is_error: bool = False
    ) -> None:
        """Hand the result in; a result the thread refuses answers the call with why.

        The call must get its one result and the run must end: a result refused for good
        (over ``max_message_bytes``) or that cannot be stored (a value the database
        rejects, a bug) would otherwise leave the row unran, and the sweeper would run the
        tool again, for ever, to be refused the same way each time. Only an unreachable
        server, still down after ``hand_in_timeout_s``, ends the run unanswered: then
        running the tool again later is the recovery.
        """
        try:
            self._hand_in(thread_id, call_id, content, is_error)
        except _THREAD_IS_DONE as refused:
            self._dropped(thread_id, call_id, refused)
        except (ControlSignal, NotFound):
            raise  # a test's crash point; a thread or call that is gone (the task's to handle)
        except Exception as error:
            if _transient(error):
                raise
            log.warning(
                "result of call %s of thread %s not stored (%s); the call is answered with why",
                call_id,
                thread_id,
                _why(error),
            )
            try:
                self._hand_in(thread_id, call_id, _refusal_result(error), True)
            except _THREAD_IS_DONE as refused:
                self._dropped(thread_id, call_id, refused)

    def _hand_in(self, thread_id: str, call_id: str, content: str, is_error: bool) -> None:
        hand_in(
            f"result of call {call_id} of thread {thread_id}",
            lambda: self._sink.tool_result(thread_id, call_id, content, is_error=is_error),
            self._timeout_s,
        )
        self.answered = True

    def _dropped(self, thread_id: str, call_id: str, refused: Exception) -> None:
        log.warning("result of call %s of thread %s dropped: %s", call_id, thread_id, refused)
        self.refused = str(refused)

    def tool_event(
        self,
        thread_id: str,
        call_id: str,
        content: str,
        *,
        associative: bool,
        final: bool,
        message_id: str | None,
    ) -> None:
        self._sink.tool_event(
            thread_id,
            call_id,
            content,
            associative=associative,
            final=final,
            message_id=message_id,
        )

    def tool_schedule(self, thread_id: str, call_id: str, content: str, at: datetime) -> None:
        self._sink.tool_schedule(thread_id, call_id, content, at)


_THREAD_IS_DONE = (ThreadClosed, SubscriptionCancelled, CallAnswered)
"""Refusals that mean the thread will never take a result for this call (closed while the
tool ran, say): the run is over and there is nobody left to answer."""

_WHY_MAX_CHARS = 1000
"""How much of a storage error's text reaches the model (a driver's error may quote the
whole statement and its parameters)."""


def _why(error: Exception) -> str:
    if isinstance(error, MessageRejected):
        return error.reason
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= _WHY_MAX_CHARS else f"{text[:_WHY_MAX_CHARS]} …"


def _refusal_result(error: Exception) -> str:
    """The error result that answers a call whose own result was refused or not stored."""
    if isinstance(error, MessageRejected):
        return f"Error: the tool's result was refused: {_why(error)}"
    return f"Error: the tool's result could not be stored: {_why(error)}"


@dataclass(frozen=True)
class _Ready:
    """A call found pending, with the tool that answers it: what is left is to run it."""

    row: OutboxRow
    tool: Tool
    call: CallRecord
    ctx: ToolContext
    sink: _RetryingSink
    crash: Callable[[str], None]
    conversation_id: str


def _run(
    row: OutboxRow,
    store: RunnerStore,
    agents: AgentRegistry,
    sink: _RetryingSink,
    callback_url: Callable[[str, str], str],
    crash: Callable[[str], None],
    whereabouts: Whereabouts | None,
) -> ToolOutcome | _Ready:
    thread = store.thread(row.thread_id)
    call = store.call(row.thread_id, row.call_id)
    if row.action == "notify":
        return notify_requested(store, agents, thread, call)
    try:
        tool = agents.get_agent(thread.agent).tool(call.name)
    except UnknownAgent as error:
        tool, missing = None, f"{error} in this worker"
    else:
        missing = f"tool {call.name!r} is not installed"
    ctx = ToolContext(row.thread_id, row.call_id, callback_url(row.thread_id, row.call_id), sink)
    if tool is None:
        if whereabouts is not None:
            where = whereabouts.locate(thread.agent, call.name, row.created_at)
            if isinstance(where, Elsewhere):
                return NotHere(where.why)
            missing = where.why
        # Gone from every worker: the row is marked ran, so the call gets its one result
        # here (and a cancel hook that can no longer run is reported, not skipped).
        if row.action == "cancel":
            log.warning(
                "cancel hook of call %s of thread %s not run: %s",
                call.call_id,
                row.thread_id,
                missing,
            )
            return CancelHookRan(False, f"not run: {missing}")
        sink.tool_result(row.thread_id, row.call_id, f"Error: {missing}", is_error=True)
        return Raised(missing)
    newer = None if whereabouts is None else whereabouts.superseded(thread.agent)
    if newer is not None:  # a deploy's new code is up: its workers run the agent's tools
        return NotHere(newer.why)
    if row.action == "cancel":
        return CancelHookRan(tool.on_cancel is not None, _cancel(tool.on_cancel, ctx))
    if call.state is not CallState.PENDING:
        return AlreadyAnswered()  # answered meanwhile: a re-dispatch must not run the tool twice
    return _Ready(row, tool, call, ctx, sink, crash, thread.root_id or thread.id)


def _traced(ready: _Ready, settings: Settings | None, run: int) -> ToolOutcome:
    """Run the tool inside its ``execute_tool`` span (when tracing is on), so the result
    it hands in carries the span to the slice that applies it."""
    span = (
        UNTRACED
        if settings is None
        else start_tool(
            settings, ready.row, ready.call.name, ready.conversation_id, run, ready.call.args
        )
    )
    with span:
        outcome = _invoke(ready)
        span.ended(outcome)
    return outcome


def _invoke(ready: _Ready) -> ToolOutcome:
    row, call, sink, tool = ready.row, ready.call, ready.sink, ready.tool
    ready.crash("in_tool")
    try:
        value = tool.invoke(call.args, ready.ctx)
    except InvalidToolArguments as error:  # a call stored under another signature
        sink.tool_result(row.thread_id, row.call_id, f"Error: {error}", is_error=True)
        return Raised(str(error))
    except Exception as error:
        log.warning(
            "tool %s failed for call %s of thread %s",
            call.name,
            row.call_id,
            row.thread_id,
            exc_info=True,
        )
        sink.tool_result(
            row.thread_id, row.call_id, f"Error: {type(error).__name__}: {error}", is_error=True
        )
        return Raised(f"{type(error).__name__}: {error}")
    if not tool.deferred:
        sink.tool_result(row.thread_id, row.call_id, as_text(value))
        return Answered()
    return Answered() if sink.answered else Started()


def _give_up(row: OutboxRow, store: RunnerStore, sink: _RetryingSink, died: int) -> ToolOutcome:
    """Answer the call of a row whose every run died, without running it again."""
    why = f"{died} runs died before finishing (each lost its worker); not run again"
    log.error("outbox row %d (call %s of thread %s): %s", row.id, row.call_id, row.thread_id, why)
    if row.action == "cancel":
        return CancelHookRan(True, why)
    if row.action == "notify":
        return Notified(why)
    if store.call(row.thread_id, row.call_id).state is not CallState.PENDING:
        return AlreadyAnswered()
    sink.tool_result(row.thread_id, row.call_id, f"Error: the tool's {why}", is_error=True)
    return Raised(why)


def _cancel(hook: Callable[[ToolContext], None] | None, ctx: ToolContext) -> str | None:
    """Run a subscription's cancel hook; its failure is logged and returned (the call is
    cancelled anyway)."""
    if hook is None:
        return None
    try:
        hook(ctx)
    except Exception as error:
        log.exception("cancel hook failed for call %s of thread %s", ctx.call_id, ctx.thread_id)
        return f"{type(error).__name__}: {error}"
    return None
