"""Child threads and threaded events (DESIGN section 5): more than one thread at a time."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dormant import Agent, ToolContext, tool
from dormant.errors import ThreadClosed
from dormant.messages import AssistantTurn, EventShown, Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.ops.check import check_store
from dormant.stores.base import CallState, InboxState, ThreadStatus
from tests.harness import Harness, results

cancelled: list[str] = []


@tool(subscription=True, on_cancel=lambda ctx: cancelled.append(ctx.call_id))
def watch_prs(repo: str) -> str:
    """Subscribe to pull requests."""
    return f"watching {repo}"


@tool(deferred=True)
def run_build(target: str, ctx: ToolContext) -> None:
    """Start a build; the result arrives later."""


def family(items: Sequence[Item]) -> Completion:
    """A parent that fans out to two children, and children that report then close."""
    last = items[-1]
    if isinstance(last, UserText):
        return reply(
            "splitting the work",
            call("spawn_thread", instructions="look into A"),
            call("spawn_thread", instructions="look into B"),
        )
    if isinstance(last, ToolResult) and last.content.startswith("You are now inside"):
        task = last.content.split("Your task: ")[1].split("\n")[0]
        return reply("", call("report_to_parent", report=f"found {task[-1]}"))
    if isinstance(last, ToolResult) and last.name == "report_to_parent":
        return reply("", call("close_thread", report="finished"))
    if isinstance(last, EventShown):
        return reply(f"parent saw: {last.content}")
    return reply("waiting for my children")


def agent(script: object, tools: Sequence[object] = ()) -> Agent:
    return Agent("a", model=ScriptedModel(script), tools=list(tools), threads=True)  # type: ignore[arg-type]


def spawn_ids(h: Harness, t: str) -> list[str]:
    calls = h.store.load(t).calls.values()
    return [c.call_id for c in sorted(calls, key=lambda c: c.call_id) if c.name == "spawn_thread"]


def test_a_child_inherits_the_history_up_to_the_spawn_by_reference_not_by_copy() -> None:
    h = Harness(agent(family))
    t = h.launch("a", "research A and B")
    h.step(t)
    child = h.store.children(t)[0]
    spawning = h.history(t)[1]
    assert isinstance(spawning, AssistantTurn)
    assert child.fork_seq == 2 and child.parent_id == t and child.root_id == t
    own = h.store.own_items(child.id)
    assert own and min(s.seq for s in own) == 3  # nothing of the parent is copied
    assert h.history(child.id)[:2] == h.history(t)[:2]


def test_reports_reach_the_parent_as_events_on_each_childs_spawn_call() -> None:
    h = Harness(agent(family))
    t = h.launch("a", "research A and B")
    h.drain()
    children = h.store.children(t)
    assert [c.status for c in children] == [ThreadStatus.CLOSED, ThreadStatus.CLOSED]
    events = [i for i in h.history(t) if isinstance(i, EventShown)]
    assert {e.original_name for e in events} == {"spawn_thread"}
    by_call = {c.parent_call_id: c.id for c in children}
    for child in children:
        mine = [e.content for e in events if e.original_call_id == child.parent_call_id]
        task = child.metadata["instructions"][-1]
        assert mine == [
            f"Report from child thread {child.id}: found {task}",
            f"Child thread {child.id} closed. Final report: finished",
        ]
    assert set(by_call) == set(spawn_ids(h, t))
    assert all(h.store.call(t, cid).state is CallState.CANCELLED for cid in by_call)


def test_a_child_uses_its_parents_agent_and_model() -> None:
    model_agent = agent(family)
    h = Harness(model_agent)
    t = h.launch("a", "research")
    h.drain()
    assert {c.agent for c in h.store.children(t)} == {"a"}
    requests = model_agent.model.requests  # type: ignore[union-attr]
    assert {r.thread_id for r in requests} >= {c.id for c in h.store.children(t)}


def test_a_spawning_turns_other_calls_are_answered_in_the_child_as_the_parents() -> None:
    def script(items: Sequence[Item]) -> Completion:
        if isinstance(items[-1], UserText):
            return reply("", call("run_build", target="x"), call("spawn_thread", instructions="t"))
        return reply("ok")

    h = Harness(agent(script, [run_build]))
    t = h.launch("a", "go")
    h.drain()
    child = h.store.children(t)[0]
    child_results = results(h.history(child.id))
    assert [r.name for r in child_results] == ["run_build", "spawn_thread"]
    assert child_results[0].content == f"(handled by the parent thread {t})"
    assert h.store.call(t, next(iter(h.store.load(t).calls))).name in {"run_build", "spawn_thread"}


def test_reports_wait_while_the_parent_waits_on_a_tool() -> None:
    def script(items: Sequence[Item]) -> Completion:
        users = [i for i in items if isinstance(i, UserText)]
        last = items[-1]
        if isinstance(last, UserText) and len(users) == 1:
            return reply("", call("spawn_thread", instructions="report soon"))
        if isinstance(last, UserText):
            return reply("", call("run_build", target="x"))
        if isinstance(last, ToolResult) and last.content.startswith("You are now inside"):
            return reply("", call("report_to_parent", report="early news"))
        return reply("ok")

    h = Harness(agent(script, [run_build]))
    t = h.launch("a", "start a child")
    h.step(t)  # the child is created, not yet run
    h.send(t, "now build")
    h.step(t)  # the parent waits on run_build
    h.drain()  # the child reports; the parent must not show it yet
    assert not any(isinstance(i, EventShown) for i in h.history(t))
    assert len(h.store.inbox(t, InboxState.DEFERRED)) == 1
    build = next(c.call_id for c in h.store.load(t).calls.values() if c.name == "run_build")
    h.deliver(t, build, "green")
    h.drain()
    kinds = [type(i).__name__ for i in h.history(t)[-3:]]
    assert kinds == ["ToolResult", "EventShown", "AssistantTurn"]


def test_a_parent_message_reaches_the_child_as_an_event_on_its_spawn_call() -> None:
    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText) and last.text == "start":
            return reply("", call("spawn_thread", instructions="wait for orders"))
        if isinstance(last, UserText):
            return reply("", call("send_message_to_child", thread_id=last.text, message="go left"))
        if isinstance(last, ToolResult) and last.content.startswith("You are now inside"):
            return reply("", call("wait_for_event"))
        return reply(f"seen: {last}")

    h = Harness(agent(script))
    t = h.launch("a", "start")
    h.drain()
    child = h.store.children(t)[0]
    h.send(t, child.id)
    h.drain()
    event = next(i for i in h.history(child.id) if isinstance(i, EventShown))
    assert event.content == "Message from the parent thread: go left"
    assert event.original_call_id == child.parent_call_id


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({}, "instructions: Field required"),
        ({"instructions": ""}, "at least 1 character"),
        ({"instructions": 42}, "valid string"),
        ({"instructions": "x", "child_of": []}, "Extra inputs"),
    ],
)
def test_malformed_spawn_thread_arguments_get_an_error_result(
    args: dict[str, object], error: str
) -> None:
    answers = iter([reply("", call("spawn_thread", **args)), reply("sorry")])
    h = Harness(agent(lambda items: next(answers)))
    t = h.launch("a", "go")
    h.step(t)
    result = results(h.history(t))[0]
    assert result.is_error and error in result.content
    assert h.store.children(t) == []


def test_a_root_thread_cannot_report_or_close_itself() -> None:
    answers = iter(
        [reply("", call("report_to_parent", report="x"), call("close_thread")), reply("ok")]
    )
    h = Harness(agent(lambda items: next(answers)))
    t = h.launch("a", "go")
    h.step(t)
    errors = [r.content for r in results(h.history(t))]
    assert "has no parent" in errors[0] and "cannot close itself" in errors[1]
    assert h.thread(t).status is ThreadStatus.IDLE


def test_closing_a_thread_closes_its_children_and_cancels_their_subscriptions() -> None:
    cancelled.clear()

    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText):
            return reply("", call("spawn_thread", instructions="manage"))
        text = last.content if isinstance(last, ToolResult) else ""
        if "manage" in text and text.startswith("You are now inside"):
            return reply(
                "", call("watch_prs", "w-mid", repo="r"), call("spawn_thread", instructions="deep")
            )
        if "deep" in text and text.startswith("You are now inside"):
            return reply("", call("watch_prs", "w-deep", repo="r"))
        return reply("idle")

    h = Harness(agent(script, [watch_prs]))
    t = h.launch("a", "go")
    h.drain()
    middle = h.store.children(t)[0]
    deep = h.store.children(middle.id)[0]
    assert h.store.call(deep.id, "w-deep").state is CallState.SUBSCRIBED
    # the middle thread now closes itself: its child and both subscriptions must end
    h.deps.agents.get_agent("a").model.script = lambda items: reply(
        "", call("close_thread", report="bye")
    )  # type: ignore[union-attr]
    h.send_event(middle.id, "w-mid", "PR #1", associative=True)
    h.drain()
    assert h.thread(middle.id).status is ThreadStatus.CLOSED
    assert h.thread(deep.id).status is ThreadStatus.CLOSED
    assert h.store.call(middle.id, "w-mid").state is CallState.CANCELLED
    assert h.store.call(deep.id, "w-deep").state is CallState.CANCELLED
    assert sorted(cancelled) == ["w-deep", "w-mid"]  # each tool's cancel hook ran once
    with pytest.raises(ThreadClosed):
        h.send(deep.id, "anyone?")


def test_a_child_closed_before_its_first_message_still_answers_its_spawn_call() -> None:
    """The middle thread spawns a child and closes in the same turn: the store closes the
    child before its first message (the spawn call's result) is applied. That message is
    refused, so closing must answer the call, or the child's history lacks a result."""

    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText):
            return reply("", call("spawn_thread", instructions="manage"))
        if isinstance(last, ToolResult) and "Your task: manage" in last.content:
            return reply(
                "", call("spawn_thread", "s-deep", instructions="deep"), call("close_thread")
            )
        return reply("idle")

    h = Harness(agent(script, []))
    t = h.launch("a", "go")
    h.drain()
    middle = h.store.children(t)[0]
    deep = h.store.children(middle.id)[0]
    assert h.thread(deep.id).status is ThreadStatus.CLOSED
    answer = results(h.history(deep.id))[-1]
    assert answer.call_id == "s-deep" and "closed first" in answer.content and answer.is_error
    refused = [r for r in h.store.inbox(deep.id) if r.message_id == "seed:s-deep"]
    assert [r.state for r in refused] == [InboxState.REJECTED]
    assert check_store(h.store) == []


def test_closing_answers_a_pending_call_and_its_tool_never_runs() -> None:
    started: list[str] = []

    @tool(deferred=True)
    def slow_build(target: str, ctx: ToolContext) -> None:
        """Start a build; the result arrives later."""
        started.append(target)

    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText):
            return reply("", call("spawn_thread", instructions="build"))
        if isinstance(last, ToolResult) and "Your task: build" in last.content:
            return reply("", call("slow_build", "b1", target="x"), call("close_thread"))
        return reply("idle")

    h = Harness(agent(script, [slow_build]))
    t = h.launch("a", "go")
    h.drain()
    child = h.store.children(t)[0]
    assert h.thread(child.id).status is ThreadStatus.CLOSED
    assert h.store.call(child.id, "b1").state is CallState.ANSWERED
    assert [r.content for r in results(h.history(child.id)) if r.call_id == "b1"] == [
        f"Not answered: thread {child.id} was closed first."
    ]
    assert started == []  # the runner runs pending calls only
    assert check_store(h.store) == []


def threaded_agent(on_event: Completion) -> Agent:
    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText):
            return reply("", call("watch_prs", "w1", repo="r"))
        if isinstance(last, EventShown):
            return on_event
        if isinstance(last, ToolResult) and last.name == "report_to_parent":
            return reply("", call("close_thread"))
        return reply("watching")

    return agent(script, [watch_prs])


def test_a_threaded_event_runs_in_a_temporary_child_and_leaves_the_parent_unchanged() -> None:
    h = Harness(threaded_agent(reply("nothing worth reporting")))
    t = h.launch("a", "watch")
    h.drain()
    before = h.history(t)
    h.send_event(t, "w1", "PR #5: typo fix", message_id="gh-5")
    h.drain()
    assert h.history(t) == before
    child = h.store.children(t)[0]
    assert child.metadata["role"] == "event" and child.status is ThreadStatus.CLOSED
    seen = h.history(child.id)
    assert seen[: len(before)] == before  # it inherited the subscriber's history
    assert (
        isinstance(seen[len(before)], EventShown) and seen[len(before)].content == "PR #5: typo fix"
    )


def test_an_event_child_reports_to_the_subscriber_on_the_subscription_call() -> None:
    h = Harness(
        threaded_agent(reply("", call("report_to_parent", report="PR #6 breaks the build")))
    )
    t = h.launch("a", "watch")
    h.drain()
    h.send_event(t, "w1", "PR #6", message_id="gh-6")
    h.drain()
    shown = [i for i in h.history(t) if isinstance(i, EventShown)]
    assert len(shown) == 1 and shown[0].original_call_id == "w1"
    assert shown[0].content.endswith("PR #6 breaks the build")
    assert h.store.call(t, "w1").state is CallState.SUBSCRIBED  # the subscription goes on


def test_events_close_together_run_as_concurrent_children() -> None:
    h = Harness(threaded_agent(reply("seen")))
    t = h.launch("a", "watch")
    h.drain()
    for n in range(3):
        h.send_event(t, "w1", f"PR #{n}", message_id=f"gh-{n}")
    h.step(t)  # one slice of the subscriber spawns all three
    children = h.store.children(t)
    assert len(children) == 3
    assert len({c.fork_seq for c in children}) == 1


def test_a_redelivered_threaded_event_never_spawns_a_second_child() -> None:
    h = Harness(threaded_agent(reply("seen")))
    t = h.launch("a", "watch")
    h.drain()
    h.send_event(t, "w1", "PR #7", message_id="gh-7")
    h.drain()
    h.dedup.add(t, [])  # the fast path may have forgotten; SQL's unique key decides
    with pytest.raises(Exception, match="gh-7"):
        h.store.enqueue(t, "gh-7", h.store.inbox(t)[-1].message, 4)
    h.drain()
    assert len(h.store.children(t)) == 1


def test_closing_an_event_thread_leaves_the_subscribers_subscription_alone() -> None:
    cancelled.clear()
    h = Harness(threaded_agent(reply("", call("report_to_parent", report="worth knowing"))))
    t = h.launch("a", "watch")
    h.drain()
    h.send_event(t, "w1", "PR #8", message_id="gh-8")
    h.drain()
    child = h.store.children(t)[0]
    assert child.status is ThreadStatus.CLOSED
    assert cancelled == []  # the subscription's cancel hook did not run
    assert h.store.call(t, "w1").state is CallState.SUBSCRIBED
    h.send_event(t, "w1", "PR #9", message_id="gh-9")  # and it still takes events
    h.drain()
    assert len(h.store.children(t)) == 2
