"""Random interleavings of messages, slices, tools, sweeps and crashes at every point of
the slice: once everything has drained, the runtime's promises hold on every thread.

- every call has exactly one result, and every result answers an earlier call;
- every user message is in the history exactly once, in send order;
- item seqs are contiguous and message ids unique; nothing is left pending in an inbox.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dormant import Agent, ToolContext, tool
from dormant.errors import CrashPoint, MessageRejected, NotFound
from dormant.messages import AssistantTurn, EventShown, Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.ops.check import check_store
from dormant.stores.base import CallState, InboxState
from tests.harness import Harness

POINTS = ["holding_lease", "after_model", "before_commit", "after_commit", "in_tool"]


@tool(deferred=True)
def build(target: str, ctx: ToolContext) -> None:
    """Start a build; its result is delivered by the test."""


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool(subscription=True)
def watch(repo: str) -> str:
    """Subscribe to a repository."""
    return f"watching {repo}"


def script(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText):
        n = int(last.text[1:])
        plans = [
            (call("build", target=f"t{n}"), call("add", a=n, b=1)),
            (call("watch", repo=f"r{n}"),),
            (call("sleep", seconds=0),),
            (),
        ]
        return reply(f"on {last.text}", *plans[n % 4])
    return reply(f"seen {type(last).__name__}")


Op = tuple[str, int, bool]
ops = st.lists(
    st.tuples(
        st.sampled_from(["send", "deliver", "event", "step", "tools", "sweep", "crash"]),
        st.integers(min_value=0, max_value=9),
        st.booleans(),
    ),
    max_size=30,
)


def apply(h: Harness, root: str, op: Op, sent: list[str]) -> None:
    kind, n, flag = op
    calls = sorted(h.store.load(root).calls.values(), key=lambda c: (c.seq, c.call_id))
    target = calls[n % len(calls)].call_id if calls else "call_nope"
    try:
        match kind:
            case "send":
                text = f"u{len(sent) + 1}"
                h.send(root, text)
                sent.append(text)
            case "deliver":  # message ids from a small pool: duplicates are likely
                h.deliver(root, target, f"result {n}", message_id=f"d{n % 3}-{target}")
            case "event":
                h.send_event(root, target, f"event {n}", associative=flag, message_id=f"e{n}")
            case "step":
                h.step(root)
            case "tools":
                h.run_tools()
            case "sweep":
                h.sweep()
            case "crash":
                h.arm(POINTS[n % len(POINTS)])
                with contextlib.suppress(CrashPoint):  # a crash is what this step is for
                    h.run_tools() if flag else h.step(root)
                h.restart()
    except (MessageRejected, NotFound):
        pass  # refused input is allowed; what matters is that nothing else changed


def drain(h: Harness) -> None:
    """Let time pass until nothing is left: timers fire, lost tasks are re-sent, and every
    build that is still waiting gets its result."""
    for _ in range(60):
        h.sweep(lost=True)
        ran = h.run_tools()
        woken = h.store.threads_to_wake(limit=1000)
        for thread_id in woken:
            h.step(thread_id)
        waiting = [
            (t.id, c.call_id)
            for t in h.store.threads(limit=1000)
            for c in h.store.load(t.id).calls.values()
            if c.state is CallState.PENDING and c.name == "build"
        ]
        for thread_id, call_id in waiting:
            h.deliver(thread_id, call_id, "green", message_id=f"final-{call_id}")
        if not ran and not woken and not waiting:
            return
    raise AssertionError("the system did not drain")


def check(h: Harness, root: str, sent: list[str]) -> None:
    users = [i.text for i in h.history(root) if isinstance(i, UserText)]
    assert users == ["u0", *sent], "user messages lost, duplicated or reordered"
    for thread in h.store.threads(limit=1000):
        own = h.store.own_items(thread.id)
        seqs = [s.seq for s in own]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True
        assert len({s.message_id for s in own}) == len(own), "a message id stored twice"
        made = [c.call_id for s in own if isinstance(s.item, AssistantTurn) for c in s.item.calls]
        answered = Counter(s.item.call_id for s in own if isinstance(s.item, ToolResult))
        for call_id in made:
            assert answered[call_id] == 1, (
                f"call {call_id} of {thread.id} has {answered[call_id]} results"
            )
        inherited = {
            c.call_id for s in h.history(thread.id) if isinstance(s, AssistantTurn) for c in s.calls
        }
        assert set(answered) <= set(made) | inherited, "a result for a call never made"
        events = [s.item for s in own if isinstance(s.item, EventShown)]
        assert len({e.call_id for e in events}) == len(events)
        assert h.store.inbox(thread.id, InboxState.PENDING) == []
        assert h.store.inbox(thread.id, InboxState.DEFERRED) == []
    assert check_store(h.store) == []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_every_call_gets_one_result_and_nothing_is_lost_whatever_the_interleaving(
    steps: list[Op],
) -> None:
    h = Harness(Agent("a", model=ScriptedModel(script), tools=[build, add, watch]))
    root = h.launch("a", "u0")
    sent: list[str] = []
    for op in steps:
        apply(h, root, op, sent)
    h.restart()
    drain(h)
    check(h, root, sent)
