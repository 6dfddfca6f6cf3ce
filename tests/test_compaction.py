"""Compaction and history reconstruction along a lineage (DESIGN sections 3 and 5)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from dormant import Agent, tool
from dormant.messages import (
    AssistantTurn,
    EventShown,
    Item,
    Summary,
    ToolCall,
    ToolResult,
    Usage,
    UserText,
)
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.runtime.slice import Failed
from dormant.settings import Settings
from dormant.stores.base import Commit, NewThread, Store, StoredItem, ThreadStatus
from tests.harness import Harness

# Reconstruction: the spec is the reference's ancestor tests (behaviour.md section 6). ---


def user(seq: int) -> StoredItem:
    return StoredItem(seq, f"m{seq}", UserText(text=f"u{seq}"))


def summary(seq: int, upto: int) -> StoredItem:
    return StoredItem(seq, f"s{seq}", Summary(text=f"summary up to {upto}", upto_seq=upto))


def append(store: Store, thread_id: str, *items: StoredItem) -> None:
    snap = store.load(thread_id)
    commit = Commit(thread_id, snap.thread.version, ThreadStatus.IDLE, 0, items=list(items))
    assert store.commit(commit) is not None


def seqs(store: Store, thread_id: str) -> list[int]:
    return [s.seq for s in store.history(thread_id)]


def child(store: Store, parent: str, fork_seq: int, name: str) -> str:
    store.create_thread(NewThread(id=name, agent="a", parent_id=parent, fork_seq=fork_seq))
    return name


def test_a_child_sees_its_parent_up_to_the_fork_then_its_own(store: Store) -> None:
    store.create_thread(NewThread(id="p", agent="a"))
    append(store, "p", *(user(i) for i in range(1, 6)))
    append(store, child(store, "p", 3, "c"), user(4), user(5))
    assert seqs(store, "c") == [1, 2, 3, 4, 5]
    assert [s.message_id for s in store.history("c")][3:] == ["m4", "m5"]
    assert store.load("c").next_seq == 6


def test_three_levels_of_ancestors(store: Store) -> None:
    store.create_thread(NewThread(id="r", agent="a"))
    append(store, "r", *(user(i) for i in range(1, 5)))
    append(store, child(store, "r", 2, "c"), user(3), user(4), user(5))
    append(store, child(store, "c", 4, "g"), user(5))
    assert seqs(store, "g") == [1, 2, 3, 4, 5]
    assert store.history("g")[2] == store.history("c")[2]  # the child's own item, not the root's


def test_a_summary_on_the_thread_itself_hides_what_it_covers(store: Store) -> None:
    store.create_thread(NewThread(id="t", agent="a"))
    append(store, "t", *(user(i) for i in range(1, 7)), summary(7, 4), user(8))
    assert seqs(store, "t") == [7, 5, 6, 8]


def test_a_summary_on_the_parent_before_the_fork_is_inherited(store: Store) -> None:
    store.create_thread(NewThread(id="p", agent="a"))
    append(store, "p", *(user(i) for i in range(1, 5)), summary(5, 3), user(6))
    append(store, child(store, "p", 6, "after"), user(7))
    append(store, child(store, "p", 4, "before"), user(5))
    assert seqs(store, "after") == [5, 4, 6, 7]
    assert seqs(store, "before") == [1, 2, 3, 4, 5]  # spawned before the compaction: exact


def test_the_latest_of_several_summaries_wins(store: Store) -> None:
    store.create_thread(NewThread(id="t", agent="a"))
    append(store, "t", *(user(i) for i in range(1, 5)), summary(5, 3), user(6), user(7))
    append(store, "t", summary(8, 6), user(9))
    assert seqs(store, "t") == [8, 7, 9]


def test_a_leaf_summary_takes_priority_over_an_ancestors(store: Store) -> None:
    store.create_thread(NewThread(id="p", agent="a"))
    append(store, "p", *(user(i) for i in range(1, 5)), summary(5, 2), user(6))
    append(store, child(store, "p", 6, "c"), user(7), user(8), summary(9, 7))
    assert seqs(store, "c") == [9, 8]


def test_a_leaf_summary_covering_only_part_of_the_inherited_prefix(store: Store) -> None:
    store.create_thread(NewThread(id="p", agent="a"))
    append(store, "p", *(user(i) for i in range(1, 6)))
    append(store, child(store, "p", 5, "c"), user(6), summary(7, 3))
    assert seqs(store, "c") == [7, 4, 5, 6]


# Automatic compaction in the slice --------------------------------------------------------


@tool(deferred=True)
def run_build(target: str) -> None:
    """Start a build; the result arrives later."""


@tool(subscription=True)
def watch(repo: str) -> str:
    """Subscribe to a repository."""
    return "watching"


@dataclass
class Chatty:
    """Reports heavy usage on every completion; answers summary requests with a summary."""

    script: object
    name: str = "chatty"
    context_window: int = 1000
    usage_tokens: int = 900
    summaries: int = 0
    requests: list[ModelRequest] = field(default_factory=list)

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        self.requests.append(request)
        if not request.tools:
            self.summaries += 1
            return Completion(text=f"summary #{self.summaries}", usage=Usage(input_tokens=100))
        done = self.script(request.items)  # type: ignore[operator]
        assert isinstance(done, Completion)
        return Completion(done.text, done.calls, Usage(input_tokens=self.usage_tokens))


def answer(text: str, *calls: ToolCall) -> Completion:
    return Completion(text=text, calls=calls)


def chat(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText) and last.text.startswith("build"):
        return answer("building", ToolCall(call_id="b1", name="run_build", args={"target": "x"}))
    if isinstance(last, UserText) and last.text.startswith("watch"):
        return answer("watching", ToolCall(call_id="w1", name="watch", args={"repo": "r"}))
    if isinstance(last, UserText) and last.text.startswith("split"):
        return answer("", ToolCall(call_id="sp", name="spawn_thread", args={"instructions": "go"}))
    return answer(f"reply to {type(last).__name__}")


def harness(model: Chatty) -> Harness:
    return Harness(Agent("a", model=model, tools=[run_build, watch], compact_at=0.75, threads=True))


def test_compaction_runs_past_compact_at_and_the_model_then_sees_the_summary_first() -> None:
    model = Chatty(chat)
    h = harness(model)
    t = h.launch("a", "hello")
    h.step(t)
    assert model.summaries == 0  # the first slice had no usage yet
    h.send(t, "more")
    h.step(t)
    assert model.summaries == 1
    last_request = model.requests[-1]
    assert isinstance(last_request.items[0], Summary) and last_request.items[0].text == "summary #1"
    assert [type(i).__name__ for i in last_request.items] == ["Summary", "UserText"]
    assert h.thread(t).usage.total_tokens == 900


def test_compaction_does_not_retrigger_right_after_it_applied() -> None:
    model = Chatty(chat, usage_tokens=10)
    h = harness(model)
    t = h.launch("a", "hello")
    h.step(t)
    h.store.commit(
        Commit(t, h.thread(t).version, ThreadStatus.IDLE, 0, usage=Usage(input_tokens=900))
    )
    h.send(t, "more")
    h.step(t)
    h.send(t, "again")
    h.step(t)
    assert model.summaries == 1


def test_compaction_during_a_pending_call_keeps_the_call_and_its_result_together() -> None:
    model = Chatty(chat)
    h = harness(model)
    t = h.launch("a", "hello")
    h.step(t)
    h.send(t, "build it")
    h.step(t)  # compacts (usage 900), then calls run_build: pending
    summary_item = next(s for s in h.stored_history(t) if isinstance(s.item, Summary))
    assert summary_item.item.upto_seq == 2  # type: ignore[union-attr]
    h.deliver(t, "b1", "green")
    h.step(t)
    visible = h.history(t)
    turn = next(i for i in visible if isinstance(i, AssistantTurn) and i.calls)
    result = next(i for i in visible if isinstance(i, ToolResult))
    assert turn.calls[0].call_id == result.call_id == "b1"
    assert visible.index(turn) < visible.index(result)


def test_a_second_compaction_summarises_the_first() -> None:
    model = Chatty(chat)
    h = harness(model)
    t = h.launch("a", "one")
    for text in ("two", "three"):
        h.step(t)
        h.send(t, text)
    h.step(t)
    assert model.summaries == 2
    second_request = [r for r in model.requests if not r.tools][1]
    assert isinstance(second_request.items[0], Summary)  # the first summary was summarised
    visible = h.history(t)
    assert isinstance(visible[0], Summary) and visible[0].text == "summary #2"
    assert sum(isinstance(i, Summary) for i in visible) == 1


def test_compaction_inside_a_child_and_a_grandchild() -> None:
    model = Chatty(chat)
    h = harness(model)
    root = h.launch("a", "split")
    h.drain()
    mid = h.store.children(root)[0]
    h.send(mid.id, "split again")
    h.drain()
    grand = h.store.children(mid.id)[0]
    for thread_id in (mid.id, grand.id):
        h.send(thread_id, "keep going")
        h.drain()
        visible = h.history(thread_id)
        assert isinstance(visible[0], Summary)
        assert isinstance(visible[-1], AssistantTurn)
        own = [s.item for s in h.store.own_items(thread_id) if isinstance(s.item, Summary)]
        assert visible[0] == own[-1]  # the thread's own latest summary, not an ancestor's
    assert all(s.seq > (grand.fork_seq or 0) for s in h.store.own_items(grand.id))


def test_children_spawned_before_a_compaction_still_see_exactly_what_they_inherited() -> None:
    model = Chatty(chat)
    h = harness(model)
    t = h.launch("a", "split")
    h.drain()
    kid = h.store.children(t)[0]
    before = h.history(kid.id)
    h.send(t, "more")
    h.drain()  # the parent compacts
    assert isinstance(h.history(t)[0], Summary)
    assert h.history(kid.id)[: len(before)] == before


def test_events_for_compacted_calls_are_still_routed() -> None:
    model = Chatty(chat)
    h = harness(model)
    t = h.launch("a", "watch it")
    h.drain()
    h.send(t, "chat")
    h.drain()
    assert not any(
        isinstance(i, AssistantTurn) and i.calls for i in h.history(t)
    )  # the subscription call is summarised away
    h.send_event(t, "w1", "PR #9", associative=True)
    h.drain()
    event = next(i for i in h.history(t) if isinstance(i, EventShown))
    assert (event.original_name, event.original_args) == ("watch", {"repo": "r"})


def test_a_compaction_is_counted_in_usage_but_not_against_the_per_message_cap() -> None:
    from dormant import Budget

    model = Chatty(chat)
    agent = Agent("a", model=model, tools=[run_build, watch], budget=Budget(max_tokens=1950))
    h = Harness(agent)
    t = h.launch("a", "hello")
    h.step(t)
    h.send(t, "more")
    h.step(t)  # a summary, then the reply
    assert model.summaries == 1
    spent = h.store.usage(thread_id=t)["a"]
    assert (spent.completions, spent.input_tokens) == (3, 900 + 100 + 900)
    assert h.store.thread(t).message_completions == 1  # the reply only
    assert h.thread(t).usage.total_tokens == 900  # the last completion's, for compaction
    h.send(t, "again")
    h.step(t)  # 1900 of 1950 spent: the compaction runs, its 100 tokens leave none to reply
    assert h.thread(t).last_error.startswith("budget: max_tokens 2000/1950")
    assert model.summaries == 2
    # the summary it paid for is kept and counted; the user's text waits for its reply
    assert h.store.thread(t).tree_tokens == 2000
    assert h.store.usage(thread_id=t)["a"].tokens == 2000
    assert h.history(t) == [Summary(text="summary #2", upto_seq=5)]
    assert [r.message.kind for r in h.store.inbox(t) if r.state.value == "pending"] == ["user"]
    h.raise_budget(t, max_tokens=5000)
    h.step(t)
    assert model.summaries == 2  # not paid for again
    assert h.history(t)[-1] == AssistantTurn(text="reply to UserText")


def test_a_compaction_the_cost_limit_stops_before_its_reply_is_kept_and_paid_once(
    store: Store,
) -> None:
    from dormant import Budget
    from dormant.models.prices import Price

    model = Chatty(chat)  # replies read 900 tokens, summaries 100: 0.9 and 0.1 at this price
    price = {"chatty": Price(input_per_mtok=1000.0, output_per_mtok=0.0)}
    budget = Budget(max_cost=1.95)
    h = Harness(Agent("a", model=model, budget=budget, prices=price), store=store)
    t = h.launch("a", "hello")
    h.step(t)
    h.send(t, "more")
    h.step(t)  # a summary, then the reply: 1.9 spent
    h.send(t, "again")
    stopped = h.step(t)  # the compaction runs; the reply it was for would pass the limit
    assert isinstance(stopped, Failed) and stopped.stalled
    assert h.thread(t).last_error.startswith("budget: max_cost 2/1.95")
    assert h.store.thread(t).tree_cost == pytest.approx(2.0)
    ledger = h.store.usage(thread_id=t)["a"]
    assert (ledger.completions, ledger.cost) == (4, pytest.approx(2.0))
    assert len(model.requests) == 4

    for _ in range(2):  # retries meet the same limit at once, paying nothing
        h.retry(t)
        assert isinstance(h.step(t), Failed)
    assert len(model.requests) == 4
    assert h.store.usage(thread_id=t)["a"].completions == 4

    h.raise_budget(t, max_cost=5.0)
    h.step(t)
    assert model.summaries == 2
    assert [type(i).__name__ for i in model.requests[-1].items] == ["Summary", "UserText"]
    assert h.history(t)[-1] == AssistantTurn(text="reply to UserText")
    assert h.store.thread(t).tree_cost == pytest.approx(2.9)


def test_a_compaction_whose_reply_the_model_fails_is_kept_and_not_paid_for_again(
    store: Store,
) -> None:
    """The summary is paid for when the reply fails: it is committed with what it cost, the
    input stays queued, and the retry asks for the reply only."""
    from dormant.errors import ModelRetryable

    failing = [True]

    def flaky(items: Sequence[Item]) -> Completion:
        if isinstance(items[0], Summary) and failing[0]:
            raise ModelRetryable("provider overloaded (529)")
        return chat(items)

    model = Chatty(flaky)
    agent = Agent("a", model=model, compact_at=0.75)
    settings = Settings(model_attempts=1, model_backoff_s=0.0, failure_backoff_s=0.0)
    h = Harness(agent, store=store, settings=settings)
    t = h.launch("a", "hello")
    h.step(t)
    h.send(t, "more")
    failed = h.step(t)  # the compaction is paid for, then its reply fails
    assert isinstance(failed, Failed) and not failed.stalled and "529" in failed.error
    assert model.summaries == 1
    assert h.history(t)[0] == Summary(text="summary #1", upto_seq=2)
    assert [r.message.kind for r in h.store.inbox(t) if r.state.value == "pending"] == ["user"]
    spent = h.store.usage(thread_id=t)["a"]
    assert (spent.completions, spent.input_tokens) == (2, 900 + 100)

    failing[0] = False
    h.step(t)
    assert model.summaries == 1, "not paid for again"
    assert h.history(t)[-1] == AssistantTurn(text="reply to UserText")
    assert h.store.usage(thread_id=t)["a"].completions == 3
