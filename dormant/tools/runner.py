"""Run one outbox row: a tool call off the slice, or a subscription's cancel hook.

Shared by the local dispatcher's thread pool and the ``dormant.tool`` Celery task. A
re-dispatched row is harmless: a call that is no longer pending is not run again, and
the result's message id is derived from the call id.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

from dormant.agents import AgentRegistry
from dormant.stores.base import CallState, OutboxRow, QueryStore
from dormant.tools.base import ToolContext, ToolSink

__all__ = ["RunnerStore", "as_text", "execute_outbox"]


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


def execute_outbox(
    row: OutboxRow,
    store: RunnerStore,
    agents: AgentRegistry,
    sink: ToolSink,
    callback_url: Callable[[str, str], str],
    crash: Callable[[str], None] = lambda _point: None,
) -> None:
    """Run ``row``; every failure of the tool becomes an "Error: ..." result (never a hang).

    The row is marked ran once the work is done or found unnecessary, so the sweeper
    re-dispatches only rows whose task the broker lost before any worker ran it.
    """
    _run(row, store, agents, sink, callback_url, crash)
    store.mark_ran([row.id])


def _run(
    row: OutboxRow,
    store: RunnerStore,
    agents: AgentRegistry,
    sink: ToolSink,
    callback_url: Callable[[str, str], str],
    crash: Callable[[str], None],
) -> None:
    thread = store.thread(row.thread_id)
    call = store.call(row.thread_id, row.call_id)
    tool = agents.get_agent(thread.agent).tool(call.name)
    ctx = ToolContext(row.thread_id, row.call_id, callback_url(row.thread_id, row.call_id), sink)
    if tool is None:
        sink.tool_result(
            row.thread_id, row.call_id, f"Error: tool {call.name!r} is not installed", is_error=True
        )
        return
    if row.action == "cancel":
        _cancel(tool.on_cancel, ctx)
        return
    if call.state is not CallState.PENDING:
        return  # answered meanwhile: a re-dispatch must not run the tool twice
    crash("in_tool")
    try:
        value = tool.invoke(call.args, ctx)
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
        return
    if not tool.deferred:
        sink.tool_result(row.thread_id, row.call_id, as_text(value))


def _cancel(hook: Callable[[ToolContext], None] | None, ctx: ToolContext) -> None:
    """Run a subscription's cancel hook; its failure is logged (the call is cancelled anyway)."""
    if hook is None:
        return
    try:
        hook(ctx)
    except Exception:
        log.exception("cancel hook failed for call %s of thread %s", ctx.call_id, ctx.thread_id)
