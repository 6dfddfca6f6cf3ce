"""``dormant check --upgrade``: what a deploy of new agent definitions would do to the
threads that live now, found before the deploy (docs/upgrades.md).

Each open thread is read against the new definitions: its agent (by name or alias), the
tools of its pending calls and live subscriptions, and the stored arguments of its pending
calls (after the tool's ``upgrade_args``). What the new code could not run is a problem:
the deploy would leave it to a worker that no longer exists, then answer it with an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from dormant.agents import Agent, AgentRegistry
from dormant.errors import UnknownAgent
from dormant.stores.base import CallRecord, CallState, Store, ThreadInfo, ThreadStatus

__all__ = ["UpgradeProblem", "check_upgrade"]

PAGE = 500
"""Threads read per page (keyset paging: as fast on the last page as on the first)."""


@dataclass(frozen=True)
class UpgradeProblem:
    thread_id: str
    kind: str
    """``agent gone``, ``tool gone``, ``arguments invalid`` or ``cancel hook gone``."""
    detail: str

    def __str__(self) -> str:
        return f"{self.thread_id}: {self.kind}: {self.detail}"


def check_upgrade(store: Store, agents: AgentRegistry) -> Iterator[UpgradeProblem]:
    """Every problem the definitions in ``agents`` would meet in the store's open threads."""
    before: tuple[datetime, str] | None = None
    while page := store.threads(limit=PAGE, before=before):
        for thread in page:
            if thread.status is not ThreadStatus.CLOSED:
                yield from _thread_problems(store, agents, thread)
        before = (page[-1].created_at, page[-1].id)


def _thread_problems(
    store: Store, agents: AgentRegistry, thread: ThreadInfo
) -> Iterator[UpgradeProblem]:
    try:
        agent = agents.get_agent(thread.agent)
    except UnknownAgent:
        yield UpgradeProblem(thread.id, "agent gone", f"agent {thread.agent!r} is not defined")
        return
    calls = store.load(thread.id).calls.values()
    for call in calls:
        if call.call_id == thread.parent_call_id:
            continue  # a child's inherited spawn call is its parent's
        if call.state in (CallState.PENDING, CallState.SUBSCRIBED):
            yield from _call_problems(thread.id, agent, call)


def _call_problems(thread_id: str, agent: Agent, call: CallRecord) -> Iterator[UpgradeProblem]:
    tool = agent.tool(call.name)
    where = f"call {call.call_id} to {call.name!r}"
    if tool is None:
        if call.state is CallState.SUBSCRIBED:
            kind, why = "cancel hook gone", f"{where} is a live subscription"
        else:
            kind, why = "tool gone", f"{where} is pending"
        yield UpgradeProblem(thread_id, kind, f"{why}; agent {agent.name!r} has no such tool")
        return
    if call.state is not CallState.PENDING or tool.builtin:
        return
    try:
        args = tool.upgrade_args(dict(call.args)) if tool.upgrade_args else call.args
    except Exception as error:
        detail = f"{where}: upgrade_args raised {type(error).__name__}: {error}"
        yield UpgradeProblem(thread_id, "arguments invalid", detail)
        return
    invalid = tool.error_for(args)
    if invalid is not None:
        detail = f"{where}: {invalid.removeprefix('Error: ')} (stored: {call.args})"
        yield UpgradeProblem(thread_id, "arguments invalid", detail)
