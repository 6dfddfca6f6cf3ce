"""A tool whose result the thread can never take is done, not re-run for ever.

Found by ``make chaos``: a thread closed while its tool ran refused the result with
``ThreadClosed``; the tool task raised, its outbox row stayed unran, and the sweeper
re-ran the tool every claim lifetime, each run refused the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dormant import Agent, tool
from dormant.agents import AgentRegistry
from dormant.errors import CallAnswered, MessageRejected, SubscriptionCancelled, ThreadClosed
from dormant.messages import Item, ToolResult
from dormant.models import ScriptedModel, reply
from dormant.models.base import Completion
from dormant.models.scripted import call
from dormant.tools.outcomes import Raised
from dormant.tools.runner import execute_outbox
from tests.harness import Harness


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _script(items: Sequence[Item]) -> Completion:
    return reply("", call("add", a=1, b=2)) if len(items) == 1 else reply("3")


class _Refusing:
    """A sink that refuses every result the way a store refuses it for ``thread_id``."""

    def __init__(self, inner: Harness, refusal: type[MessageRejected]) -> None:
        self.inner = inner
        self.refusal = refusal

    def tool_result(self, thread_id: str, call_id: str, content: str, **_: object) -> None:
        if self.refusal is ThreadClosed:
            raise ThreadClosed(thread_id)
        if self.refusal is SubscriptionCancelled:
            raise SubscriptionCancelled(thread_id, call_id)
        raise CallAnswered(thread_id, call_id, "m-1")

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@pytest.mark.parametrize("refusal", [ThreadClosed, SubscriptionCancelled, CallAnswered])
def test_a_result_refused_for_good_marks_the_row_ran(
    refusal: type[MessageRejected], monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(Agent("a", model=ScriptedModel(_script), tools=[add]))
    thread_id = h.launch("a", "add them")
    h.step(thread_id)
    (row,) = h.outbox
    ran: list[int] = []
    mark_ran = h.store.mark_ran
    monkeypatch.setattr(h.store, "mark_ran", lambda ids: (ran.extend(ids), mark_ran(ids))[1])
    execute_outbox(row, h.store, h.deps.agents, _Refusing(h, refusal), h.callback_url)
    assert ran == [row.id]


def test_a_tool_whose_agent_this_worker_lacks_answers_its_call_with_why() -> None:
    """A tool task on a worker deployed without the thread's agent marks its row ran (no
    other worker would be sent it): the call still gets its one result."""
    h = Harness(Agent("a", model=ScriptedModel(_script), tools=[add]))
    thread_id = h.launch("a", "add them")
    h.step(thread_id)
    (row,) = h.outbox
    outcome = execute_outbox(row, h.store, AgentRegistry(), h, h.callback_url)
    assert outcome == Raised("unknown agent 'a'; registered: none in this worker")
    h.settle(thread_id)
    result = h.history(thread_id)[-2]
    assert isinstance(result, ToolResult) and result.is_error
    assert result.content == "Error: unknown agent 'a'; registered: none in this worker"


def test_a_run_after_max_runs_died_answers_the_call_without_starting_the_tool() -> None:
    ran: list[int] = []

    @tool(name="add")
    def counting_add(a: int, b: int) -> int:
        """Add two numbers."""
        ran.append(a + b)
        return a + b

    h = Harness(Agent("a", model=ScriptedModel(_script), tools=[counting_add]))
    thread_id = h.launch("a", "add them")
    h.step(thread_id)
    (row,) = h.outbox
    outcome = execute_outbox(row, h.store, h.deps.agents, h, h.callback_url, run=3, max_runs=2)
    assert ran == [], "the tool that killed two workers is not started a third time"
    assert outcome == Raised("2 runs died before finishing (each lost its worker); not run again")
    h.settle(thread_id)
    result = h.history(thread_id)[-2]
    assert isinstance(result, ToolResult) and result.is_error
