"""Which built-ins a request offers: only those that can apply in the thread's situation."""

from __future__ import annotations

from collections.abc import Sequence

from dormant import Agent, tool
from dormant.messages import Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion, ModelRequest
from tests.harness import Harness, results

WAITS = ["sleep", "sleep_until", "wait_for_event"]


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool(subscription=True)
def watch(repo: str) -> str:
    """Watch a repository."""
    return f"watching {repo}"


def offered(request: ModelRequest) -> list[str]:
    return [spec.name for spec in request.tools]


def requests_of(agent: Agent, thread_id: str) -> list[ModelRequest]:
    assert isinstance(agent.model, ScriptedModel)
    return [r for r in agent.model.requests if r.thread_id == thread_id]


def test_a_root_thread_is_offered_its_tools_and_the_waits_only() -> None:
    agent = Agent("a", model=ScriptedModel(lambda _items: reply("hi")), tools=[lookup])
    h = Harness(agent)
    t = h.launch("a", "hello")
    h.settle(t)
    assert [offered(r) for r in requests_of(agent, t)] == [["lookup", *WAITS]]


def test_an_agent_with_threads_is_offered_spawn_and_message_tools_at_the_root() -> None:
    agent = Agent("a", model=ScriptedModel(lambda _i: reply("hi")), tools=[lookup], threads=True)
    h = Harness(agent)
    t = h.launch("a", "hello")
    h.settle(t)
    assert [offered(r) for r in requests_of(agent, t)] == [
        ["lookup", *WAITS, "spawn_thread", "send_message_to_child"]
    ]


def spawner(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText):
        return reply("", call("spawn_thread", instructions="look around"))
    if isinstance(last, ToolResult) and last.content.startswith("You are now inside"):
        return reply("", call("close_thread", report="done"))
    return reply("ok")


def test_a_child_is_offered_report_and_close_and_the_parent_cancel_once_it_has_spawned() -> None:
    agent = Agent("a", model=ScriptedModel(spawner), threads=True)
    h = Harness(agent)
    t = h.launch("a", "fork")
    h.drain()
    (child,) = h.store.children(t)
    parent = [offered(r) for r in requests_of(agent, t)]
    # The spawn call is an open subscription from the next round on.
    assert parent[:2] == [
        [*WAITS, "spawn_thread", "send_message_to_child"],
        [*WAITS, "cancel_subscription", "spawn_thread", "send_message_to_child"],
    ]
    # The child's inherited spawn call is its parent's, not a subscription it can cancel.
    assert offered(requests_of(agent, child.id)[0]) == [
        *WAITS,
        "spawn_thread",
        "report_to_parent",
        "close_thread",
        "send_message_to_child",
    ]


def test_cancel_subscription_is_offered_only_while_a_subscription_is_open() -> None:
    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText) and last.text == "watch":
            return reply("", call("watch", repo="r"))
        if isinstance(last, ToolResult) and last.name == "watch":
            return reply("", call("cancel_subscription", call_id=last.call_id))
        return reply("ok")

    agent = Agent("a", model=ScriptedModel(script), tools=[watch])
    h = Harness(agent)
    t = h.launch("a", "watch")
    h.settle(t)
    h.send(t, "anything new?")
    h.settle(t)
    assert [offered(r) for r in requests_of(agent, t)] == [
        ["watch", *WAITS],  # nothing open yet
        ["watch", *WAITS, "cancel_subscription"],  # the watch's first result arrived
        ["watch", *WAITS],  # cancelled in the previous round
        ["watch", *WAITS],
    ]


def test_calls_to_built_ins_that_are_not_offered_get_clear_error_results() -> None:
    def script(items: Sequence[Item]) -> Completion:
        if isinstance(items[-1], UserText):
            return reply(
                "",
                call("spawn_thread", instructions="x"),
                call("report_to_parent", report="r"),
                call("close_thread"),
                call("cancel_subscription", call_id="nope"),
            )
        return reply("ok")

    h = Harness(Agent("a", model=ScriptedModel(script), tools=[lookup]))
    t = h.launch("a", "try everything")
    h.settle(t)
    answers = {r.name: (r.is_error, r.content) for r in results(h.history(t))}
    assert answers == {
        "spawn_thread": (
            True,
            "Error: tool 'spawn_thread' does not exist. Available tools: lookup, sleep, "
            "sleep_until, wait_for_event.",
        ),
        "report_to_parent": (
            True,
            "Error: this is a root thread; it has no parent to report to",
        ),
        "close_thread": (
            True,
            "Error: the root thread cannot close itself; it stays open for the user",
        ),
        "cancel_subscription": (True, "Error: 'nope' is not one of your subscriptions"),
    }
