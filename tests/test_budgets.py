"""Budgets: a looping agent stops with a visible reason, and resumes when its budget is
raised; usage is counted per thread, rolled up to the root and kept in the ledger."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from dormant import Agent, Budget
from dormant.errors import ConfigurationError
from dormant.messages import (
    AssistantTurn,
    EventShown,
    Item,
    StatusChanged,
    ToolResult,
    Usage,
    UserText,
)
from dormant.models import ModelSettings, ScriptedModel, call, reply
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.models.prices import Price, cost_of
from dormant.ops.check import check_store
from dormant.runtime.slice import Failed, Idle, Stalled, Waiting
from dormant.settings import Settings
from dormant.stores.base import InboxState, Store, ThreadStatus
from dormant.tools import tool
from tests.harness import Harness


@tool
def ping() -> str:
    """Ping."""
    return "pong"


def looping(items: Sequence[Item]) -> Completion:
    """A model that calls a tool on every turn, whatever it is shown."""
    return Completion(
        text="again", calls=(call("ping"),), usage=Usage(input_tokens=100, output_tokens=10)
    )


def loop_agent(budget: Budget | None = None, **options: object) -> Agent:
    model = ScriptedModel(looping, name="gpt-4.1-mini")
    return Agent("looper", model=model, tools=[ping], budget=budget or Budget(), **options)  # type: ignore[arg-type]


def harness(agent: Agent, store: Store | None = None) -> Harness:
    return Harness(agent, settings=Settings(model_backoff_s=0.0), store=store)


def turns(h: Harness, thread_id: str) -> int:
    return sum(isinstance(i, AssistantTurn) for i in h.history(thread_id))


def run_until_stopped(h: Harness, thread_id: str, max_steps: int = 200) -> Failed:
    """Slices and tools until a slice fails (the budget), or the test fails."""
    for _ in range(max_steps):
        outcome = h.step(thread_id)
        if isinstance(outcome, Failed):
            return outcome
        h.run_tools()
    raise AssertionError(f"thread {thread_id} still running after {max_steps} slices")


def test_a_looping_agent_stops_at_its_per_message_cap_with_the_reason_visible(
    store: Store,
) -> None:
    h = harness(loop_agent(Budget(max_completions_per_message=3)), store)
    t = h.launch("looper", "go")
    failed = run_until_stopped(h, t)
    assert failed.stalled
    info = h.thread(t)
    assert info.status is ThreadStatus.STALLED
    assert info.last_error.startswith("budget: max_completions_per_message 3/3")
    assert turns(h, t) == 3
    assert any(isinstance(e, StatusChanged) and e.detail.startswith("budget:") for e in h.events(t))
    # the tool result that would need a fourth completion is still waiting
    assert h.store.has_pending_after(t, 0)


def test_the_default_budget_stops_a_loop_at_fifty_completions_per_message() -> None:
    h = harness(loop_agent())
    t = h.launch("looper", "go")
    run_until_stopped(h, t, max_steps=120)
    assert turns(h, t) == 50
    assert h.thread(t).last_error.startswith("budget: max_completions_per_message 50/50")


def test_raise_budget_resumes_the_thread_and_it_stops_again_at_the_new_limit(
    store: Store,
) -> None:
    h = harness(loop_agent(Budget(max_completions_per_message=None, max_tokens=300)), store)
    t = h.launch("looper", "go")
    run_until_stopped(h, t)
    assert turns(h, t) == 3  # 110 tokens each: 330 >= 300 before the fourth
    assert h.thread(t).last_error.startswith("budget: max_tokens 330/300")
    assert h.thread(t).tree_tokens == 330

    resumed = h.raise_budget(t, max_tokens=600)
    assert resumed.status is not ThreadStatus.STALLED
    run_until_stopped(h, t)
    assert turns(h, t) == 6
    assert h.thread(t).last_error.startswith("budget: max_tokens 660/600")
    assert h.store.thread(t).metadata["budget"] == {"max_tokens": 600}


def test_a_cost_limit_counts_the_price_table_and_an_agent_can_price_its_own_model() -> None:
    agent = loop_agent(
        Budget(max_completions_per_message=None, max_cost=0.001),
        prices={"gpt-4.1-mini": Price(input_per_mtok=2.0, output_per_mtok=10.0)},
    )
    h = harness(agent)
    t = h.launch("looper", "go")
    run_until_stopped(h, t)
    # each completion: 100 * 2 / 1e6 + 10 * 10 / 1e6 = 0.0003
    assert turns(h, t) == 4
    assert h.thread(t).last_error.startswith("budget: max_cost 0.0012/0.001")
    assert h.store.usage(thread_id=t)["looper"].cost == pytest.approx(0.0012)


def test_a_launch_budget_replaces_the_agents_for_that_thread() -> None:
    h = harness(loop_agent(Budget(max_completions_per_message=10)))
    t = h.launch("looper", "go", budget=Budget(max_completions_per_message=2))
    run_until_stopped(h, t)
    assert turns(h, t) == 2
    assert h.thread(t).metadata["budget"]["max_completions_per_message"] == 2


def test_the_per_message_cap_resets_on_user_text_and_on_retry(store: Store) -> None:
    h = harness(loop_agent(Budget(max_completions_per_message=2)), store)
    t = h.launch("looper", "go")
    run_until_stopped(h, t)
    assert turns(h, t) == 2
    assert h.store.thread(t).message_completions == 2

    h.retry(t)  # resets the count: two more
    assert h.store.thread(t).message_completions == 0
    run_until_stopped(h, t)
    assert turns(h, t) == 4

    h.retry(t)
    h.send(t, "and again")  # user text: the count starts over with it
    run_until_stopped(h, t)
    assert turns(h, t) == 6
    assert isinstance(h.history(t)[-1], AssistantTurn)
    assert any(isinstance(i, UserText) and i.text == "and again" for i in h.history(t))


def test_a_stalled_by_budget_thread_is_not_woken_by_the_sweeper(store: Store) -> None:
    h = harness(loop_agent(Budget(max_completions_per_message=1)), store)
    t = h.launch("looper", "go")
    run_until_stopped(h, t)
    assert h.store.has_pending_after(t, 0)  # its input waits...
    later = datetime.now(UTC) + timedelta(days=1)
    assert t not in h.store.threads_to_wake(now=later)  # ...and nobody wakes it
    assert isinstance(h.step(t), Stalled)  # a slice woken anyway (a lost wake) does nothing
    assert turns(h, t) == 1


def test_child_and_event_thread_usage_counts_towards_the_roots_tree(store: Store) -> None:
    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText):
            return Completion(
                calls=(call("spawn_thread", instructions="work"),),
                usage=Usage(input_tokens=50, output_tokens=5),
            )
        if isinstance(last, ToolResult) and last.name == "spawn_thread" and "child" in last.content:
            return Completion(
                calls=(call("close_thread", report="done"),),
                usage=Usage(input_tokens=1000, output_tokens=100),
            )
        return Completion(text="ok", usage=Usage(input_tokens=7, output_tokens=3))

    model = ScriptedModel(script, name="gpt-4.1-mini")
    agent = Agent("parent", model=model, threads=True)
    h = Harness(agent, store=store)
    root = h.launch("parent", "go")
    h.drain()
    children = h.store.children(root)
    assert len(children) == 1
    child = children[0].id
    child_usage = h.store.usage(thread_id=child)["parent"]
    assert child_usage.tokens >= 1100
    root_usage = h.store.usage(thread_id=root)["parent"]
    total = h.store.usage()["parent"]
    assert total.tokens == root_usage.tokens + child_usage.tokens
    info = h.store.thread(root)
    assert info.tree_tokens == total.tokens
    assert info.tree_cost == pytest.approx(total.cost)
    assert info.tree_cost > 0
    assert h.store.thread(child).tree_tokens == 0


def test_tool_choice_is_sent_only_with_the_first_completion_after_user_text() -> None:
    model = ScriptedModel(looping, name="m")
    settings = ModelSettings(tool_choice="required")
    h = harness(
        Agent(
            "a",
            model=model,
            tools=[ping],
            model_settings=settings,
            budget=Budget(max_completions_per_message=3),
        )
    )
    t = h.launch("a", "go")
    run_until_stopped(h, t)
    h.retry(t)
    h.send(t, "more")
    run_until_stopped(h, t)
    sent = [r.settings.tool_choice for r in model.requests]
    assert sent == ["required", None, None, "required", None, None]


def test_tool_choice_every_turn_sends_it_on_every_request() -> None:
    model = ScriptedModel(looping, name="m")
    settings = ModelSettings(tool_choice="required", tool_choice_every_turn=True)
    agent = Agent(
        "a",
        model=model,
        tools=[ping],
        model_settings=settings,
        budget=Budget(max_completions_per_message=3),
    )
    h = harness(agent)
    run_until_stopped(h, h.launch("a", "go"))
    assert [r.settings.tool_choice for r in model.requests] == ["required"] * 3


def test_usage_since_counts_only_later_slices_and_filters_by_agent(store: Store) -> None:
    quiet = Agent("quiet", model=ScriptedModel(lambda _i: reply("hi"), name="gpt-4.1-mini"))
    h = Harness(quiet, loop_agent(Budget(max_completions_per_message=2)), store=store)
    a = h.launch("quiet", "hello")
    h.step(a)
    b = h.launch("looper", "go")
    run_until_stopped(h, b)
    everything = h.store.usage()
    assert set(everything) == {"quiet", "looper"}
    looper = everything["looper"]
    assert (looper.completions, looper.input_tokens, looper.output_tokens) == (2, 200, 20)
    expected = cost_of(Usage(input_tokens=200, output_tokens=20), "gpt-4.1-mini")
    assert looper.cost == pytest.approx(expected)
    assert set(h.store.usage(agent="quiet")) == {"quiet"}
    assert h.store.usage(since=datetime.now(UTC) + timedelta(minutes=1)) == {}


def test_a_budget_refuses_non_positive_limits() -> None:
    with pytest.raises(ConfigurationError):
        Budget(max_tokens=0)
    h = harness(loop_agent())
    t = h.launch("looper", "go")
    with pytest.raises(ConfigurationError, match="max_cost must be positive"):
        h.raise_budget(t, max_cost=-1.0)
    assert "budget" not in h.store.thread(t).metadata  # nothing was stored


class _Counting:
    name = "counting"
    context_window = 1000

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        self.calls += 1
        return reply("fine")


def test_an_idle_agent_under_budget_runs_as_before() -> None:
    model = _Counting()
    h = harness(Agent("a", model=model))
    t = h.launch("a", "hi")
    assert isinstance(h.step(t), Idle)
    assert model.calls == 1
    assert h.store.usage(thread_id=t)["a"].completions == 1
    assert not isinstance(h.step(t), Waiting)


def test_a_limit_met_inside_a_slice_commits_its_turns_and_queues_the_results_not_yet_read(
    store: Store,
) -> None:
    """Calls answered inside the slice (a tool the agent lacks) ask the model again in the
    same slice: the turns already made are kept, and counted, when the budget stops it;
    the results its model has not read yet wait in the inbox, so the thread resumes with
    them when its budget is raised."""
    model = ScriptedModel(looping, name="gpt-4.1-mini")
    agent = Agent("lacking", model=model, budget=Budget(max_completions_per_message=2))
    h = harness(agent, store)
    t = h.launch("lacking", "go")
    stopped = h.step(t)
    assert isinstance(stopped, Failed) and stopped.stalled
    assert turns(h, t) == 2 and len(model.requests) == 2
    info = h.store.thread(t)
    assert info.status is ThreadStatus.STALLED
    assert info.last_error.startswith("budget: max_completions_per_message 2/2")
    assert h.store.usage(thread_id=t)["lacking"].completions == 2
    last = h.history(t)[-1]
    assert isinstance(last, AssistantTurn)  # its result is queued, not in the history yet
    [held] = h.store.inbox(t, InboxState.PENDING)
    assert held.message.kind == "result" and held.message.call_id == last.calls[0].call_id
    assert check_store(h.store) == []  # a call waiting for its queued result, well formed

    h.raise_budget(t, max_completions_per_message=3)
    assert h.store.thread(t).status is ThreadStatus.WAITING
    assert isinstance(h.step(t), Failed)
    assert turns(h, t) == 5
    shown = model.requests[2].items[-1]
    assert isinstance(shown, ToolResult) and shown.call_id == last.calls[0].call_id
    assert check_store(h.store) == []


def test_a_child_stopped_right_after_reporting_closes_once_its_budget_is_raised(
    store: Store,
) -> None:
    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText):
            return reply("", call("spawn_thread", instructions="look into it"))
        if isinstance(last, ToolResult) and last.content.startswith("You are now inside"):
            return reply("", call("report_to_parent", report="found it"))
        if isinstance(last, ToolResult) and last.name == "report_to_parent":
            return reply("", call("close_thread", report="done"))
        return reply("noted")

    model = ScriptedModel(script, name="gpt-4.1-mini")
    agent = Agent("a", model=model, threads=True, budget=Budget(max_completions_per_message=1))
    h = harness(agent, store)
    root = h.launch("a", "go")
    h.drain()
    (child,) = h.store.children(root)
    assert h.store.thread(child.id).last_error.startswith("budget: max_completions_per_message")

    h.raise_budget(root, max_completions_per_message=5)
    h.drain()
    assert h.store.thread(child.id).status is ThreadStatus.CLOSED
    reports = [i.content for i in h.history(root) if isinstance(i, EventShown)]
    assert reports == [
        f"Report from child thread {child.id}: found it",
        f"Child thread {child.id} closed. Final report: done",
    ]
    assert h.store.thread(root).status is ThreadStatus.IDLE
    assert check_store(h.store) == []


@tool(subscription=True)
def watch_prs(repo: str) -> str:
    """Subscribe to pull requests."""
    return f"watching {repo}"


def test_an_event_threads_usage_counts_towards_the_subscribers_tree(store: Store) -> None:
    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText):
            return reply("", call("watch_prs", "w1", repo="r"))
        if isinstance(last, EventShown):  # in the event thread
            return Completion(text="seen", usage=Usage(input_tokens=5000, output_tokens=500))
        return reply("watching")

    model = ScriptedModel(script, name="claude-sonnet-4-5")
    h = Harness(Agent("a", model=model, tools=[watch_prs]), store=store)
    t = h.launch("a", "watch")
    h.drain()
    before = h.store.thread(t)
    h.send_event(t, "w1", "PR #5", message_id="gh-5")
    h.drain()
    (event,) = h.store.children(t)
    assert event.metadata["role"] == "event"
    assert h.store.usage(thread_id=event.id)["a"].tokens == 5500
    after = h.store.thread(t)
    assert after.tree_tokens == before.tree_tokens + 5500
    assert after.tree_cost == pytest.approx(before.tree_cost + (5000 * 3.0 + 500 * 15.0) / 1e6)


def test_local_system_reports_a_budget_stop_and_raise_budget_resumes_it() -> None:
    from dormant import LocalSystem
    from dormant.errors import ThreadsFailed

    agent = loop_agent(Budget(max_completions_per_message=4))
    with LocalSystem([agent], database_url="memory://") as system:
        t = system.launch("looper", "go")
        with pytest.raises(ThreadsFailed, match="budget: max_completions_per_message 4/4"):
            system.run_until_idle()
        system.raise_budget(t, max_completions_per_message=6)
        with pytest.raises(ThreadsFailed, match="budget: max_completions_per_message 6/6"):
            system.run_until_idle()
        # retry reset the count, and the raised cap allowed 6 more
        assert sum(isinstance(i, AssistantTurn) for i in system.history(t)) == 10
