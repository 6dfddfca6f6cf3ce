"""A crash at each step of the slice (DESIGN section 4): the rerun yields one turn,
one result per call, nothing lost."""

from __future__ import annotations

from collections import Counter

import pytest

from dormant import Agent, tool
from dormant.messages import AssistantTurn, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.stores.base import InboxState
from tests.harness import Harness

runs: Counter[str] = Counter()


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    runs[key] += 1
    return f"value of {key}"


def make() -> Harness:
    def script(items: list[object]) -> object:
        if isinstance(items[-1], UserText):
            return reply("looking", call("lookup", key="k1"), call("lookup", key="k2"))
        return reply("found both")

    return Harness(Agent("a", model=ScriptedModel(script), tools=[lookup]))  # type: ignore[arg-type]


def assert_exactly_once(h: Harness, t: str) -> None:
    items = h.history(t)
    assert [type(i).__name__ for i in items] == [
        "UserText",
        "AssistantTurn",
        "ToolResult",
        "ToolResult",
        "AssistantTurn",
    ]
    turn = items[1]
    assert isinstance(turn, AssistantTurn)
    answered = Counter(i.call_id for i in items if isinstance(i, ToolResult))
    assert answered == Counter({c.call_id: 1 for c in turn.calls})
    assert all(r.state is InboxState.DONE for r in h.store.inbox(t))
    assert h.store.undispatched(h.store.thread(t).updated_at.replace(year=2100)) == []


@pytest.mark.parametrize("point", ["holding_lease", "after_model", "before_commit"])
def test_a_crash_before_the_commit_reruns_the_slice_with_nothing_lost(point: str) -> None:
    h = make()
    t = h.launch("a", "find k1 and k2")
    h.crash_at(point, lambda: h.step(t))
    assert h.history(t) == []  # nothing of the dead slice reached storage
    assert h.store.threads_to_wake() == [t]  # the sweeper re-drives the thread
    h.settle(t)
    assert_exactly_once(h, t)


def test_a_crash_after_the_commit_before_dispatch_is_redispatched_by_the_sweeper() -> None:
    h = make()
    t = h.launch("a", "find k1 and k2")
    h.crash_at("after_commit", lambda: h.step(t))
    assert h.outbox == []  # the tool calls were committed but never dispatched
    h.sweep()
    assert len(h.outbox) == 2
    h.settle(t)
    assert_exactly_once(h, t)


def test_a_crash_inside_a_tool_is_redispatched_and_answered_once() -> None:
    runs.clear()
    h = make()
    t = h.launch("a", "find k1 and k2")
    h.step(t)
    rows = list(h.outbox)
    h.crash_at("in_tool", h.run_tools)
    for row in rows:  # a broker redelivers the unacked tool task
        h.dispatch(row)
    h.settle(t)
    assert_exactly_once(h, t)


def test_a_double_dispatch_runs_each_tool_at_most_twice_and_answers_once() -> None:
    runs.clear()
    h = make()
    t = h.launch("a", "find k1 and k2")
    h.step(t)
    h.outbox += list(h.outbox)  # every tool task delivered twice
    h.settle(t)
    assert_exactly_once(h, t)
    assert set(runs.values()) == {2}  # at least once: the tool sees its call_id both times
