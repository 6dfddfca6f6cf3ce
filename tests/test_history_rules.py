"""The history rules of DESIGN section 5, one slice at a time, in memory."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dormant import Agent, ToolContext, tool
from dormant.budget import DEFAULT_MAX_COMPLETIONS_PER_MESSAGE
from dormant.errors import CallAnswered, DuplicateMessage, SubscriptionCancelled, UnknownCall
from dormant.messages import (
    EVENT_TOOL_NAME,
    AssistantTurn,
    EventShown,
    Item,
    Rejected,
    ToolResult,
    ToolResultMessage,
    UserText,
)
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.runtime.history import INTERRUPTED
from dormant.runtime.outcomes import Failed
from dormant.runtime.slice import Idle, Waiting
from dormant.settings import Settings
from dormant.stores.base import CallState, InboxState, Priority, ThreadStatus
from tests.harness import Harness, results

started: list[str] = []


@tool(deferred=True)
def run_build(target: str, ctx: ToolContext) -> None:
    """Start a CI build; the result arrives through the callback."""
    started.append(ctx.call_id)


@tool(subscription=True)
def watch_prs(repo: str) -> str:
    """Subscribe to pull requests of a repository."""
    return f"watching {repo}"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def explode() -> str:
    """Always fails."""
    raise RuntimeError("kaboom")


TOOLS = [run_build, watch_prs, add, explode]


def agent_with(script: object, name: str = "a") -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(script)  # type: ignore[arg-type]
    return Agent(name, model=model, tools=TOOLS), model


def on_user(*calls: object) -> object:
    """A script: each user text asks for ``calls``; anything else gets a plain reply."""

    def script(items: Sequence[Item]) -> Completion:
        if isinstance(items[-1], UserText):
            return reply("on it", *calls)  # type: ignore[arg-type]
        return reply("noted")

    return script


def first_user(*calls: object) -> object:
    """A script: only the first user text asks for ``calls``; everything else gets a reply."""

    def script(items: Sequence[Item]) -> Completion:
        users = sum(isinstance(i, UserText) for i in items)
        if isinstance(items[-1], UserText) and users == 1:
            return reply("on it", *calls)  # type: ignore[arg-type]
        return reply("noted")

    return script


def the_call(h: Harness, thread_id: str, name: str) -> str:
    return next(c.call_id for c in h.store.load(thread_id).calls.values() if c.name == name)


def test_first_result_answers_the_pending_call() -> None:
    h = Harness(agent_with(on_user(call("run_build", target="main")))[0])
    t = h.launch("a", "build main")
    assert isinstance(h.step(t), Waiting)
    build = the_call(h, t, "run_build")
    h.deliver(t, build, "green")
    assert isinstance(h.step(t), Idle)
    assert results(h.history(t)) == [ToolResult(call_id=build, name="run_build", content="green")]
    assert h.store.call(t, build).state is CallState.ANSWERED


def test_a_second_result_for_an_answered_call_is_refused_at_deliver_naming_the_call() -> None:
    a, model = agent_with(on_user(call("run_build", target="main")))
    h = Harness(a)
    t = h.launch("a", "build main")
    h.step(t)
    build = the_call(h, t, "run_build")
    h.deliver(t, build, "green", message_id="ci-1")
    h.step(t)
    before, inbox, completions = h.history(t), h.store.inbox(t), len(model.requests)
    with pytest.raises(CallAnswered, match=f"call {build!r} of thread {t!r} already has"):
        h.deliver(t, build, "red", message_id="another-delivery")
    with pytest.raises(DuplicateMessage, match="ci-1"):  # the answer itself, again: harmless
        h.deliver(t, build, "green", message_id="ci-1")
    h.step(t)
    assert (h.history(t), h.store.inbox(t), len(model.requests)) == (before, inbox, completions)


def test_a_second_result_queued_with_the_first_is_rejected_with_a_visible_reason() -> None:
    h = Harness(agent_with(on_user(call("run_build", target="main")))[0])
    t = h.launch("a", "build main")
    h.step(t)
    build = the_call(h, t, "run_build")
    h.deliver(t, build, "green", message_id="ci-1")
    h.deliver(t, build, "red", message_id="ci-2")  # both queued before a slice runs
    h.step(t)
    assert [r.content for r in results(h.history(t))] == ["green"]
    second = h.store.inbox(t)[-1]
    assert (second.message_id, second.state) == ("ci-2", InboxState.REJECTED)
    assert "already has its result" in second.reason
    [rejected] = [e for e in h.events(t) if isinstance(e, Rejected)]
    assert rejected.message_id == "ci-2" and "already has its result" in rejected.reason


def test_a_late_result_after_interruption_still_becomes_an_event_then_more_are_refused() -> None:
    h = Harness(agent_with(first_user(call("run_build", target="main")))[0])
    t = h.launch("a", "build main")
    h.step(t)
    build = the_call(h, t, "run_build")
    h.send(t, "never mind")
    h.step(t)
    h.deliver(t, build, "green", message_id="ci-late")
    h.step(t)
    shown = [i.content for i in h.history(t) if isinstance(i, EventShown)]
    assert shown == ["late result: green"]
    with pytest.raises(CallAnswered):
        h.deliver(t, build, "green again", message_id="ci-later")


def test_redelivered_message_id_is_refused_and_history_is_unchanged() -> None:
    h = Harness(agent_with(on_user(call("run_build", target="main")))[0])
    t = h.launch("a", "build main")
    h.step(t)
    build = the_call(h, t, "run_build")
    h.deliver(t, build, "green", message_id="ci-123")
    with pytest.raises(DuplicateMessage, match="ci-123"):
        h.deliver(t, build, "green", message_id="ci-123")
    h.step(t)
    assert len(results(h.history(t))) == 1


def test_an_associative_event_is_shown_inline_as_a_synthetic_call() -> None:
    h = Harness(agent_with(on_user(call("watch_prs", repo="acme/api")))[0])
    t = h.launch("a", "watch PRs")
    h.step(t)
    h.run_tools()
    h.step(t)
    watch = the_call(h, t, "watch_prs")
    assert h.store.call(t, watch).state is CallState.SUBSCRIBED
    h.send_event(t, watch, "PR #42 opened", associative=True)
    h.step(t)
    event = next(i for i in h.history(t) if isinstance(i, EventShown))
    assert event.content == "PR #42 opened"
    synthetic = event.as_call()
    assert synthetic.name == EVENT_TOOL_NAME
    assert synthetic.args == {
        "original_tool_name": "watch_prs",
        "original_tool_call_id": watch,
        "original_args": {"repo": "acme/api"},
    }
    assert isinstance(h.history(t)[-1], AssistantTurn)


def test_events_are_deferred_while_a_non_passive_call_is_pending() -> None:
    script = on_user(call("watch_prs", repo="r"))
    h = Harness(agent_with(script)[0])
    t = h.launch("a", "watch")
    h.step(t)
    h.run_tools()
    h.step(t)
    watch = the_call(h, t, "watch_prs")
    h.send(t, "now build")  # the model now starts a build and waits for it
    h.deps.agents.get_agent("a").model.script = on_user(call("run_build", target="main"))  # type: ignore[union-attr]
    h.step(t)
    build = the_call(h, t, "run_build")
    h.send_event(t, watch, "PR #7 opened", associative=True)
    assert isinstance(h.step(t), Waiting)
    assert not any(isinstance(i, EventShown) for i in h.history(t))
    assert h.store.inbox(t, InboxState.DEFERRED)[0].message.content == "PR #7 opened"  # type: ignore[union-attr]
    h.deliver(t, build, "green")
    h.step(t)
    kinds = [type(i).__name__ for i in h.history(t)[-3:]]
    assert kinds == ["ToolResult", "EventShown", "AssistantTurn"]  # the event after the result


def test_a_stale_result_does_not_flush_deferred_events() -> None:
    script = on_user(
        call("watch_prs", repo="r"), call("run_build", target="x"), call("add", a=1, b=2)
    )
    h = Harness(agent_with(script)[0])
    t = h.launch("a", "go")
    h.step(t)
    h.run_tools()
    h.step(t)
    watch, build, add_id = (the_call(h, t, n) for n in ("watch_prs", "run_build", "add"))
    h.send_event(t, watch, "PR #1", associative=True)
    # A second result for the answered add, queued past deliver's check (as in a race):
    # it is rejected and settles nothing.
    stale = ToolResultMessage(call_id=add_id, content="3")
    h.store.enqueue(t, "stale-redelivery", stale, Priority.BACKGROUND)
    h.step(t)
    assert h.store.inbox(t, InboxState.REJECTED)[0].message_id == "stale-redelivery"
    assert h.store.call(t, build).state is CallState.PENDING
    assert not any(isinstance(i, EventShown) for i in h.history(t))
    assert [r.message_id for r in h.store.inbox(t, InboxState.DEFERRED)] != []
    h.deliver(t, build, "green")
    h.step(t)
    assert [i.content for i in h.history(t) if isinstance(i, EventShown)] == ["PR #1"]


def test_user_text_interrupts_every_pending_call() -> None:
    h = Harness(
        agent_with(on_user(call("run_build", target="a"), call("run_build", target="b")))[0]
    )
    t = h.launch("a", "build both")
    h.step(t)
    h.send(t, "stop, never mind")
    h.deps.agents.get_agent("a").model.script = lambda items: reply("ok")  # type: ignore[union-attr]
    assert isinstance(h.step(t), Idle)
    interrupted = [r for r in results(h.history(t)) if r.content == INTERRUPTED]
    assert len(interrupted) == 2
    assert isinstance(h.history(t)[-2], UserText)


def test_late_result_after_interruption_becomes_an_event() -> None:
    h = Harness(agent_with(first_user(call("run_build", target="main")))[0])
    t = h.launch("a", "build")
    h.step(t)
    build = the_call(h, t, "run_build")
    h.send(t, "actually, wait")
    h.step(t)
    h.deliver(t, build, "green after all")
    h.step(t)
    event = [i for i in h.history(t) if isinstance(i, EventShown)]
    assert [e.content for e in event] == ["late result: green after all"]
    assert event[0].original_call_id == build
    assert h.store.call(t, build).state is CallState.ANSWERED


def test_late_subscription_result_after_interruption_keeps_the_subscription_active() -> None:
    h = Harness(agent_with(first_user(call("watch_prs", repo="r")))[0])
    t = h.launch("a", "watch")
    h.step(t)
    watch = the_call(h, t, "watch_prs")
    h.send(t, "hold on")
    h.step(t)
    h.deliver(t, watch, "watching r")
    h.step(t)
    assert h.store.call(t, watch).state is CallState.SUBSCRIBED
    h.send_event(t, watch, "PR #9", associative=True)
    h.step(t)
    assert [e.content for e in h.history(t) if isinstance(e, EventShown)][-1] == "PR #9"


def test_several_queued_messages_are_applied_in_one_slice_with_one_completion() -> None:
    a, model = agent_with(lambda items: reply("ok"))
    h = Harness(a)
    t = h.launch("a", "one")
    h.send(t, "two")
    h.send(t, "three")
    h.step(t)
    assert [i.text for i in h.history(t) if isinstance(i, UserText)] == ["one", "two", "three"]
    assert len(model.requests) == 1


def test_parallel_tool_calls_are_all_recorded_and_dispatched() -> None:
    a, model = agent_with(
        on_user(call("add", a=1, b=2), call("add", a=3, b=4), call("run_build", target="x"))
    )
    h = Harness(a)
    t = h.launch("a", "go")
    outcome = h.step(t)
    assert isinstance(outcome, Waiting) and len(outcome.call_ids) == 3
    assert [r.action for r in h.outbox] == ["tool", "tool", "tool"]
    turn = h.history(t)[1]
    assert isinstance(turn, AssistantTurn) and len(turn.calls) == 3
    h.run_tools()
    h.step(t)  # two adds answered, the build still pending: no completion
    assert len(model.requests) == 1
    h.deliver(t, the_call(h, t, "run_build"), "green")
    h.step(t)
    assert len(model.requests) == 2
    assert sorted(r.content for r in results(h.history(t))) == ["3", "7", "green"]


def test_model_calling_the_reserved_name_gets_an_error_and_is_asked_again() -> None:
    answers = iter([reply("", call(EVENT_TOOL_NAME, original_tool_name="x")), reply("sorry")])
    a, model = agent_with(lambda items: next(answers))
    h = Harness(a)
    t = h.launch("a", "hi")
    assert isinstance(h.step(t), Idle)
    error = results(h.history(t))[0]
    assert error.is_error and EVENT_TOOL_NAME in error.content
    assert len(model.requests) == 2
    assert all(EVENT_TOOL_NAME not in [s.name for s in r.tools] for r in model.requests)


def test_unknown_tool_gets_an_error_result_and_the_model_is_asked_again() -> None:
    answers = iter([reply("", call("delete_everything")), reply("ok")])
    a, model = agent_with(lambda items: next(answers))
    h = Harness(a)
    t = h.launch("a", "hi")
    h.step(t)
    error = results(h.history(t))[0]
    assert error.is_error and "'delete_everything' does not exist" in error.content
    assert len(model.requests) == 2


def test_arguments_failing_the_schema_get_an_error_result() -> None:
    answers = iter([reply("", call("add", a="one", b=2)), reply("", call("add", a=1)), reply("ok")])
    a, _ = agent_with(lambda items: next(answers))
    h = Harness(a)
    t = h.launch("a", "hi")
    h.step(t)
    errors = [r.content for r in results(h.history(t))]
    assert "a: Input should be a valid integer" in errors[0]
    assert "b: Field required" in errors[1]
    assert h.outbox == []


def test_a_slice_out_of_rounds_queues_the_unread_results_and_the_next_one_goes_on() -> None:
    """``max_rounds_per_slice`` bounds a slice, not the turn: the results the model has
    not read yet go to the thread's inbox and the thread is woken, so the model sees them
    in the next slice instead of the thread going idle on calls it never saw answered."""

    def script(items: Sequence[Item]) -> Completion:
        seen = len(results(items))
        return reply(f"done after {seen} errors") if seen >= 3 else reply("", call("nope"))

    a, model = agent_with(script)
    h = Harness(a, settings=Settings(model_backoff_s=0.0, max_rounds_per_slice=2))
    t = h.launch("a", "hi")
    assert isinstance(h.step(t), Waiting) and h.woken[-1] == t
    assert len(model.requests) == 2
    (queued,) = h.store.inbox(t, InboxState.PENDING)
    assert queued.message.kind == "result"
    assert isinstance(h.step(t), Idle)
    history = h.history(t)
    assert history[-1] == AssistantTurn(text="done after 3 errors")
    calls = [c.call_id for i in history if isinstance(i, AssistantTurn) for c in i.calls]
    assert [r.call_id for r in results(history)] == calls, "each call one result, in order"


def test_a_model_that_keeps_calling_invalid_tools_is_stopped_by_its_budget() -> None:
    """Slice after slice, the loop ends where the per-message budget says: an answer."""
    a, model = agent_with(lambda items: reply("", call("nope")))
    h = Harness(a)
    t = h.launch("a", "hi")
    for _ in range(DEFAULT_MAX_COMPLETIONS_PER_MESSAGE):
        outcome = h.step(t)
        if not isinstance(outcome, Waiting):
            break
    assert isinstance(outcome, Failed) and outcome.stalled
    assert "max_completions_per_message" in outcome.error
    assert len(model.requests) == DEFAULT_MAX_COMPLETIONS_PER_MESSAGE


def test_a_tool_exception_becomes_an_error_result() -> None:
    h = Harness(agent_with(on_user(call("explode")))[0])
    t = h.launch("a", "hi")
    h.settle(t)
    error = results(h.history(t))[0]
    assert error.is_error and error.content == "Error: RuntimeError: kaboom"
    assert isinstance(h.history(t)[-1], AssistantTurn)


def test_events_after_cancel_subscription_are_refused_with_a_reason() -> None:
    answers = iter(
        [
            reply("", call("watch_prs", "w1", repo="r")),
            reply("watching"),
            reply("", call("cancel_subscription", call_id="w1")),
            reply("cancelled"),
        ]
    )
    a, _ = agent_with(lambda items: next(answers))
    h = Harness(a)
    t = h.launch("a", "watch")
    h.settle(t)
    h.send(t, "stop watching")
    h.settle(t)
    assert h.store.call(t, "w1").state is CallState.CANCELLED
    assert [
        r.action for r in h.store.undispatched(h.store.thread(t).created_at.replace(year=2100))
    ] == []
    with pytest.raises(SubscriptionCancelled, match="w1"):
        h.send_event(t, "w1", "PR #3")
    assert not any(isinstance(i, EventShown) for i in h.history(t))


def test_an_event_racing_a_cancellation_is_rejected_in_the_slice_with_a_rejected_event() -> None:
    h: Harness

    def script(items: Sequence[Item]) -> Completion:
        users = [i for i in items if isinstance(i, UserText)]
        if isinstance(items[-1], UserText) and len(users) == 1:
            return reply("", call("watch_prs", "w1", repo="r"))
        if isinstance(items[-1], UserText):
            # An event arrives while this completion runs: queued, but not in this slice.
            h.send_event(t, "w1", "PR #4", message_id="evt-4")
            return reply("", call("cancel_subscription", call_id="w1"))
        return reply("ok")

    h = Harness(agent_with(script)[0])
    t = h.launch("a", "watch")
    h.settle(t)
    h.send(t, "stop watching")
    h.step(t)
    assert h.store.call(t, "w1").state is CallState.CANCELLED
    assert h.woken[-1] == t  # the slice saw the row arrive and asked for another slice
    h.step(t)
    rejected = h.store.inbox(t, InboxState.REJECTED)
    assert [(r.message_id, r.reason) for r in rejected] == [
        ("evt-4", "subscription 'w1' is no longer active")
    ]
    assert any(isinstance(e, Rejected) and e.message_id == "evt-4" for e in h.events(t))
    assert not any(isinstance(i, EventShown) for i in h.history(t))


def test_final_event_ends_the_subscription() -> None:
    h = Harness(agent_with(on_user(call("watch_prs", "w1", repo="r")))[0])
    t = h.launch("a", "watch")
    h.settle(t)
    h.send_event(t, "w1", "repo archived", final=True)
    h.step(t)
    assert h.store.call(t, "w1").state is CallState.CANCELLED
    with pytest.raises(SubscriptionCancelled):
        h.send_event(t, "w1", "more")


def test_a_result_for_a_call_the_agent_never_made_is_refused_naming_it() -> None:
    h = Harness(agent_with(on_user())[0])
    t = h.launch("a", "hi")
    h.step(t)
    with pytest.raises(UnknownCall, match="never made call 'call_forged'"):
        h.deliver(t, "call_forged", "x")
    assert h.store.inbox(t, InboxState.PENDING) == []


def test_rejected_rows_carry_a_reason_and_emit_a_rejected_event() -> None:
    h = Harness(agent_with(on_user(call("run_build", target="x")))[0])
    t = h.launch("a", "build")
    h.step(t)
    build = the_call(h, t, "run_build")
    h.deliver(t, build, "green")
    h.store.set_status(t, ThreadStatus.CLOSED)
    h.step(t)
    row = h.store.inbox(t, InboxState.REJECTED)[0]
    assert row.reason == f"thread {t!r} is closed"
    assert any(isinstance(e, Rejected) and e.reason == row.reason for e in h.events(t))
    assert len(results(h.history(t))) == 0


def test_model_reused_call_ids_get_fresh_ones_so_each_call_has_one_result() -> None:
    answers = iter(
        [reply("", call("add", "same", a=1, b=1), call("add", "same", a=2, b=2)), reply("ok")]
    )
    a, _ = agent_with(lambda items: next(answers))
    h = Harness(a)
    t = h.launch("a", "hi")
    h.settle(t)
    turn = h.history(t)[1]
    assert isinstance(turn, AssistantTurn)
    ids = [c.call_id for c in turn.calls]
    assert len(set(ids)) == 2
    assert sorted(r.call_id for r in results(h.history(t))) == sorted(ids)
