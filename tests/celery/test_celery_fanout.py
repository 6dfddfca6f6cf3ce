"""Fan-out on two workers: a parent spawns 20 children in one turn, each reports once and
closes, and the parent receives every report exactly once, on the right spawn call."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

from conftest import Deployment, wait_until
from fanout_agents import FANOUT, completions_key

from dormant.client import Client
from dormant.messages import AssistantTurn, EventShown, ToolResult, UserText
from dormant.stores.base import InboxState, ThreadStatus


def _settled(client: Client, parent: str) -> bool:
    children = client.store.children(parent)
    if len(children) < FANOUT or any(c.status is not ThreadStatus.CLOSED for c in children):
        return False
    if client.store.inbox(parent, InboxState.PENDING) or client.store.inbox(
        parent, InboxState.DEFERRED
    ):
        return False
    history = client.history(parent)
    events = sum(isinstance(i, EventShown) for i in history)
    return (
        events >= 2 * FANOUT
        and isinstance(history[-1], AssistantTurn)
        and client.thread(parent).status is ThreadStatus.IDLE
    )


def test_a_parent_fans_out_to_twenty_children_on_two_workers(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_AGENTS="fanout_agents")
    workers = [d.start_worker("w1", concurrency=4), d.start_worker("w2", concurrency=4)]
    d.wait_ready(*workers)
    client = d.client()

    parent = client.launch("fanout", "split the work")
    wait_until(
        lambda: _settled(client, parent),
        45,
        "every child to report and close, and the parent to answer",
        check=d.check_alive,
        poll_s=0.1,
    )

    # The parent's turn: 20 spawn calls, each answered at once, then its reply.
    stored = client.stored_history(parent)
    history = [s.item for s in stored]
    assert history[0] == UserText(text="split the work")
    spawning = history[1]
    assert isinstance(spawning, AssistantTurn) and len(spawning.calls) == FANOUT
    tasks = {c.call_id: c.args["instructions"] for c in spawning.calls}
    assert sorted(tasks.values()) == sorted(f"task {n}" for n in range(FANOUT))
    assert [type(i) for i in history[2 : 2 + FANOUT]] == [ToolResult] * FANOUT
    assert history[2 + FANOUT] == AssistantTurn(text="waiting for reports")

    # Exactly 20 children, all closed, one per spawn call.
    children = client.store.children(parent)
    assert len(children) == FANOUT
    assert all(c.status is ThreadStatus.CLOSED for c in children)
    assert sorted(c.parent_call_id or "" for c in children) == sorted(tasks)
    for child in children:
        assert child.metadata["instructions"] == tasks[child.parent_call_id or ""]

    # One report and one close event per child, on its spawn call, in that order.
    events = [i for i in history if isinstance(i, EventShown)]
    assert len(events) == 2 * FANOUT, [e.content for e in events]
    assert len({e.call_id for e in events}) == len(events)
    for child in children:
        mine = [e for e in events if child.id in e.content]
        task = tasks[child.parent_call_id or ""]
        assert [e.content for e in mine] == [
            f"Report from child thread {child.id}: result of {task}",
            f"Child thread {child.id} closed.",
        ], mine
        assert all(e.original_call_id == child.parent_call_id for e in mine)
        assert all(e.original_name == "spawn_thread" for e in mine)

    # The parent answered every batch of reports, and its last answer saw all of them.
    assert isinstance(history[-1], AssistantTurn)
    assert history[-1].text == f"noted {2 * FANOUT} events"
    after_reply = history[2 + FANOUT + 1 :]
    for before, after in itertools.pairwise(after_reply):
        if isinstance(after, AssistantTurn):
            assert isinstance(before, EventShown), "the parent answered without a new event"
    assert len({s.message_id for s in stored}) == len(stored), "an item was stored twice"
    assert [s.seq for s in stored] == list(range(1, len(stored) + 1))
    rows = client.store.inbox(parent)
    assert len(rows) == 1 + 2 * FANOUT
    assert all(r.state is InboxState.DONE for r in rows), [(r.state, r.reason) for r in rows]

    # Each child: the parent's history up to the spawning turn, the results it owes for the
    # turn's other calls, the seed, its report and its close; nothing rejected.
    for child in children:
        inherited = client.stored_history(child.id)
        assert [s.seq for s in inherited] == list(range(1, len(inherited) + 1))
        assert [s.item for s in inherited[:2]] == history[:2]
        seed = inherited[2 + FANOUT - 1].item
        assert isinstance(seed, ToolResult) and seed.call_id == child.parent_call_id
        assert seed.content.startswith(
            f"You are now inside child thread {child.id}, spawned by thread {parent}. "
            f"Your task: {child.metadata['instructions']}\n"
        ), seed
        own = [s.item for s in client.store.own_items(child.id)]
        calls = [c.name for i in own if isinstance(i, AssistantTurn) for c in i.calls]
        assert calls == ["report_to_parent", "close_thread"], own
        child_rows = client.store.inbox(child.id)
        assert [r.state for r in child_rows] == [InboxState.DONE], child_rows

    # Both worker processes ran slices.
    completions = [r.split() for r in d.redis.lrange(completions_key(d.prefix), 0, -1)]
    pids = Counter(int(pid) for _, pid in completions)
    assert set(pids) == {w.popen.pid for w in workers}, pids
    per_thread = Counter(thread_id for thread_id, _ in completions)
    assert all(per_thread[c.id] == 2 for c in children), per_thread
    turns = sum(isinstance(i, AssistantTurn) for i in history)
    assert per_thread[parent] == turns, "a completion of the parent was thrown away"
