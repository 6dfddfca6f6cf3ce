"""The invariant checker finds each broken promise, and none in a sound store.

Each test breaks one promise by writing rows the runtime would never write (through the
store's own ``commit``), on memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dormant.agents import Agent
from dormant.messages import (
    AssistantTurn,
    EventMessage,
    Item,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    UserMessage,
    UserText,
)
from dormant.models.base import Completion
from dormant.models.scripted import ScriptedModel, call, reply
from dormant.ops.check import Problem, check_store
from dormant.stores.base import (
    CallRecord,
    CallState,
    Commit,
    NewThread,
    Store,
    StoredItem,
    ThreadStatus,
)
from dormant.tools.base import ToolContext, tool
from tests.harness import Harness

WAITING, CLOSED = ThreadStatus.WAITING, ThreadStatus.CLOSED


@tool(deferred=True)
def build(target: str, ctx: ToolContext) -> None:
    """Start a build."""


def script(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText):
        return reply(
            "building", call("build", target=last.text), call("spawn_thread", instructions="watch")
        )
    return reply("done")


def rules(problems: list[Problem]) -> list[str]:
    return [p.rule for p in problems]


def new_thread(store: Store, thread_id: str = "thr_check") -> str:
    store.create_thread(NewThread(id=thread_id, agent="a"))
    return thread_id


def write(store: Store, thread_id: str, *items: Item, **fields: Any) -> None:
    """Commit ``items`` (and ``fields``) as one slice would, consuming every pending row."""
    snap = store.load(thread_id)
    stored = [
        StoredItem(snap.next_seq + i, f"m{snap.next_seq + i}", it) for i, it in enumerate(items)
    ]
    fields.setdefault("done", [r.id for r in snap.inbox])
    commit = Commit(
        thread_id=thread_id,
        version=snap.thread.version,
        status=fields.pop("status", ThreadStatus.IDLE),
        inbox_seen=max((r.id for r in snap.inbox), default=0),
        items=stored,
        **fields,
    )
    assert store.commit(commit) is not None


def test_a_store_the_runtime_wrote_has_no_problems(store: Store) -> None:
    h = Harness(Agent("a", model=ScriptedModel(script), tools=[build], threads=True), store=store)
    t = h.launch("a", "main")
    drain(h)
    [pending] = [c for c in store.load(t).calls.values() if c.state is CallState.PENDING]
    assert check_store(store) == []  # a deferred build still out is not a problem
    h.deliver(t, pending.call_id, "green")
    drain(h)
    assert len(store.threads()) == 2  # the child ran too
    assert check_store(store) == []


def drain(h: Harness) -> None:
    """Run every woken slice and dispatched tool until nothing is left to do."""
    for _ in range(50):
        woken = h.store.threads_to_wake(limit=100)
        for thread_id in woken:
            h.step(thread_id)
        if not h.run_tools() and not woken:
            return
    raise AssertionError("the store did not drain")


def test_a_call_answered_twice_is_found(store: Store) -> None:
    t = new_thread(store)
    turn = AssistantTurn(calls=(ToolCall(call_id="c1", name="build"),))
    result = ToolResult(call_id="c1", name="build", content="green")
    record = CallRecord("c1", "build", {}, 2, CallState.ANSWERED)
    write(store, t, UserText(text="go"), turn, result, result, calls=[record])
    [problem] = check_store(store)
    assert (problem.rule, problem.thread_id) == ("one result per call", t)
    assert "build c1 has 2 results" in problem.detail


def test_a_call_without_result_that_is_not_pending_is_found(store: Store) -> None:
    t = new_thread(store)
    turn = AssistantTurn(calls=(ToolCall(call_id="c1", name="build"),))
    record = CallRecord("c1", "build", {}, 2, CallState.ANSWERED)
    write(store, t, UserText(text="go"), turn, calls=[record])
    assert rules(check_store(store)) == ["one result per call"]


def test_a_result_for_a_call_never_made_is_found(store: Store) -> None:
    t = new_thread(store)
    write(store, t, ToolResult(call_id="ghost", name="build", content="x"))
    assert rules(check_store(store)) == ["one result per call"]


def test_a_pending_message_nobody_applied_is_found_only_after_the_grace(store: Store) -> None:
    t = new_thread(store)
    store.enqueue(t, "late", UserMessage(text="hello?"), 8)
    assert check_store(store, grace_s=3600) == []
    [problem] = check_store(store)
    assert problem.rule == "stuck" and "(late) was never applied" in problem.detail


def test_user_messages_applied_out_of_arrival_order_are_found(store: Store) -> None:
    t = new_thread(store)
    store.enqueue(t, "first", UserMessage(text="one"), 8)
    store.enqueue(t, "second", UserMessage(text="two"), 8)
    snap = store.load(t)
    items = [
        StoredItem(snap.next_seq, "second", UserText(text="two")),
        StoredItem(snap.next_seq + 1, "first", UserText(text="one")),
    ]
    commit = Commit(t, snap.thread.version, ThreadStatus.IDLE, snap.inbox[-1].id, items=items)
    commit.done.extend(r.id for r in snap.inbox)
    assert store.commit(commit) is not None
    assert rules(check_store(store)) == ["user order"]


def test_a_consumed_message_missing_from_the_history_is_found(store: Store) -> None:
    t = new_thread(store)
    store.enqueue(t, "lost", UserMessage(text="hello"), 8)
    write(store, t)  # marks the row done, stores nothing
    [problem] = check_store(store)
    assert problem.rule == "user messages" and "lost" in problem.detail


def test_a_status_that_disagrees_with_the_calls_is_found(store: Store) -> None:
    waiting = new_thread(store, "thr_waiting")
    write(store, waiting, UserText(text="go"), status=ThreadStatus.WAITING)
    stalled = new_thread(store, "thr_stalled")
    store.set_status(stalled, ThreadStatus.STALLED)
    found = {(p.thread_id, p.detail) for p in check_store(store)}
    assert found == {
        (waiting, "waiting, but no call is pending"),
        (stalled, "stalled without a reason"),
    }


def test_an_outbox_row_never_dispatched_is_found(store: Store) -> None:
    t = new_thread(store)
    turn = AssistantTurn(calls=(ToolCall(call_id="c1", name="build"),))
    record = CallRecord("c1", "build", {}, 2, CallState.PENDING)
    write(
        store,
        t,
        UserText(text="go"),
        turn,
        calls=[record],
        outbox=[("c1", "tool")],
        status=ThreadStatus.WAITING,
    )
    [problem] = check_store(store)
    assert problem.rule == "outbox" and "was never dispatched" in problem.detail
    [row] = store.undispatched(problem_time(store, t))
    store.mark_dispatched([row.id])
    assert "was dispatched but never ran" in check_store(store)[0].detail
    store.mark_ran([row.id])
    assert check_store(store) == []


def problem_time(store: Store, thread_id: str) -> Any:
    return store.thread(thread_id).updated_at.replace(year=2100)


def test_seqs_that_do_not_run_on_are_found(store: Store) -> None:
    t = new_thread(store)
    snap = store.load(t)
    items = [
        StoredItem(snap.next_seq, "one", UserText(text="one")),
        StoredItem(snap.next_seq + 2, "two", UserText(text="two")),  # a gap
    ]
    commit = Commit(t, snap.thread.version, ThreadStatus.IDLE, 0, items=items)
    assert store.commit(commit) is not None
    [problem] = check_store(store)
    assert problem.rule == "seqs" and "do not run on" in problem.detail


def test_a_deferred_row_with_no_call_pending_is_found_only_after_the_grace(store: Store) -> None:
    t = new_thread(store)
    store.enqueue(t, "later", UserMessage(text="after the call"), 8)
    [row] = store.inbox(t)
    write(store, t, done=[], deferred=[row.id])  # deferred behind a call that is not there
    assert check_store(store, grace_s=3600) == []
    [problem] = check_store(store)
    assert problem.rule == "stuck" and "(later) deferred with no call pending" in problem.detail


def test_a_result_or_event_marked_consumed_that_never_reached_the_history_is_found(
    store: Store,
) -> None:
    t = new_thread(store)
    build_call = ToolCall(call_id="b1", name="build")
    watch_call = ToolCall(call_id="w1", name="watch")
    records = [
        CallRecord("b1", "build", {}, 2, CallState.PENDING),
        CallRecord("w1", "watch", {}, 2, CallState.SUBSCRIBED, subscription=True),
    ]
    turn = AssistantTurn(calls=(build_call, watch_call))
    watching = ToolResult(call_id="w1", name="watch", content="watching")
    write(store, t, UserText(text="go"), turn, watching, calls=records, status=WAITING)
    store.enqueue(t, "ci-1", ToolResultMessage(call_id="b1", content="green"), 4)
    store.enqueue(t, "pr-7", EventMessage(call_id="w1", content="PR 7", associative=True), 4)
    write(store, t, status=WAITING)  # marks both rows done, stores nothing
    [problem] = check_store(store)
    assert (problem.rule, problem.detail) == (
        "messages",
        "consumed but not in any history: ci-1, pr-7",
    )


def test_a_threaded_event_is_found_in_the_child_it_started_and_a_late_wake_shows_nothing(
    store: Store,
) -> None:
    """Not problems: what the runtime consumes on purpose without showing it here."""
    t = new_thread(store)
    turn = AssistantTurn(calls=(ToolCall(call_id="w1", name="watch"),))
    records = [CallRecord("w1", "watch", {}, 2, CallState.SUBSCRIBED, subscription=True)]
    write(
        store,
        t,
        UserText(text="go"),
        turn,
        ToolResult(call_id="w1", name="watch", content="ok"),
        calls=records,
    )
    store.enqueue(t, "pr-7", EventMessage(call_id="w1", content="PR 7"), 4)
    child = NewThread(
        id="thr_child", agent="a", parent_id=t, parent_call_id="w1", fork_seq=3, root_id=t
    )
    write(
        store,
        t,
        threads=[child],
        enqueue=[
            (
                "thr_child",
                "event:pr-7",
                EventMessage(call_id="w1", content="PR 7", associative=True),
                4,
            )
        ],
    )
    assert check_store(store, grace_s=3600) == []
    sleeper = new_thread(store, "thr_sleeper")
    nap = AssistantTurn(calls=(ToolCall(call_id="s1", name="sleep"),))
    woken = ToolResult(call_id="s1", name="sleep", content="woken up: an event arrived")
    records = [CallRecord("s1", "sleep", {}, 2, CallState.ANSWERED, passive=True)]
    write(store, sleeper, UserText(text="nap"), nap, woken, calls=records)
    store.enqueue(sleeper, "timer:s1", ToolResultMessage(call_id="s1", content="slept"), 4)
    write(store, sleeper)  # the timer's wake-up came after the wait was over: no news
    assert check_store(store, grace_s=3600) == []


def test_a_call_without_its_call_record_is_found(store: Store) -> None:
    t = new_thread(store)
    turn = AssistantTurn(calls=(ToolCall(call_id="c1", name="build"),))
    result = ToolResult(call_id="c1", name="build", content="green")
    write(store, t, UserText(text="go"), turn, result)  # as if the call row were deleted
    [problem] = check_store(store)
    assert (problem.rule, problem.detail) == ("call records", "calls without a record: c1")


def test_a_closed_thread_with_a_live_subscription_or_a_pending_call_is_found(store: Store) -> None:
    watching = new_thread(store, "thr_watching")
    turn = AssistantTurn(calls=(ToolCall(call_id="w1", name="watch"),))
    record = CallRecord("w1", "watch", {}, 2, CallState.SUBSCRIBED, subscription=True)
    result = ToolResult(call_id="w1", name="watch", content="watching")
    write(store, watching, UserText(text="go"), turn, result, calls=[record], status=CLOSED)
    building = new_thread(store, "thr_building")
    turn = AssistantTurn(calls=(ToolCall(call_id="b1", name="build"),))
    record = CallRecord("b1", "build", {}, 2, CallState.PENDING)
    write(store, building, UserText(text="go"), turn, calls=[record], status=CLOSED)
    found = {(p.thread_id, p.rule, p.detail) for p in check_store(store)}
    assert found == {
        (watching, "closed", "closed with calls still live: w1"),
        (building, "closed", "closed with calls still live: b1"),
    }
