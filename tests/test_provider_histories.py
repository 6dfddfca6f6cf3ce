"""Whatever arrives in whatever order, every request a model receives is one both providers'
APIs accept.

Random sequences of user text, results (duplicates and late ones included), events,
interruptions, child threads and their reports, cancellations, crashes and sweeps drive a
model that calls every kind of tool, built-ins and invalid calls included. The model checks
each request it receives against the rules the OpenAI Chat Completions and Anthropic
Messages APIs enforce (the rules a 400 from either names), through dormant's own wire
mappings.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dormant import Agent
from dormant.errors import CrashPoint, DormantError
from dormant.messages import EVENT_TOOL_NAME, Item, ToolCall
from dormant.models import ScriptedModel, anthropic_wire, call, openai_wire, reply
from dormant.models.base import Completion
from tests.harness import Harness
from tests.test_invariants import add, build, watch

POINTS = ["holding_lease", "after_model", "before_commit", "after_commit", "in_tool"]


def plan(items: Sequence[Item]) -> tuple[ToolCall, ...]:
    """A turn's calls, chosen by the history's length: every kind of call, valid or not."""
    text = " ".join(str(i) for i in items)
    children = re.findall(r"thr_[0-9a-f]{6,}", text)
    subscriptions = re.findall(r"call_id='(\w+)', name='watch'", text)
    plans: list[tuple[ToolCall, ...]] = [
        (call("build", target="t"), call("add", a=1, b=2)),
        (call("watch", repo="r"),),
        (call("spawn_thread", instructions="check it"),),
        (call("report_to_parent", report="all good"),),
        (call("close_thread", report="done"),),
        (call("cancel_subscription", call_id=subscriptions[-1] if subscriptions else "nope"),),
        (call("sleep", seconds=0),),
        (call("wait_for_event"),),
        (),
        (
            call(
                "send_message_to_child",
                thread_id=children[-1] if children else "thr_x",
                message="hi",
            ),
        ),
        (call("no_such_tool"), call(EVENT_TOOL_NAME, original_tool_name="watch")),
        (call("add", a="not a number"),),
    ]
    return plans[len(items) % len(plans)]


class CheckingModel:
    """A scripted model that records every way a request breaks a provider's rules."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self.requests = 0

    def script(self, items: Sequence[Item]) -> Completion:
        self.requests += 1
        for rule in openai_violations(openai_wire.messages("Be useful.", items)):
            self.violations.append(f"OpenAI: {rule}")
        for rule in anthropic_violations(anthropic_wire.messages(items)):
            self.violations.append(f"Anthropic: {rule}")
        return reply(f"turn {len(items)}", *plan(items))


def openai_violations(messages: list[dict[str, Any]]) -> list[str]:
    found: list[str] = []
    expected: list[str] = []  # tool_call ids still owed a tool message
    seen_ids: set[str] = set()
    for message in messages:
        role = message["role"]
        if role != "tool" and expected:
            found.append(f"a {role} message before the results of {expected}")
            expected = []
        if role == "assistant":
            calls = [c["id"] for c in message.get("tool_calls") or []]
            if not message.get("content") and not calls:
                found.append("an assistant message with neither content nor tool calls")
            if seen_ids & set(calls) or len(set(calls)) != len(calls):
                found.append(f"a tool_call id used twice: {calls}")
            seen_ids |= set(calls)
            expected = calls
        elif role == "tool":
            if message["tool_call_id"] not in expected:
                found.append(f"a tool message for {message['tool_call_id']} nobody awaits")
            else:
                expected.remove(message["tool_call_id"])
    if expected:
        found.append(f"the request ends before the results of {expected}")
    if messages and messages[-1]["role"] not in ("user", "tool"):
        found.append(f"the request ends with a {messages[-1]['role']} message")
    return found


def anthropic_violations(messages: list[dict[str, Any]]) -> list[str]:
    found: list[str] = []
    roles = [m["role"] for m in messages]
    if roles and roles[0] != "user":
        found.append("the first message is not the user's")
    if any(a == b for a, b in itertools.pairwise(roles)):
        found.append(f"roles do not alternate: {roles}")
    if roles and roles[-1] != "user":
        found.append("the request does not end with the user")
    uses: list[str] = []
    seen_ids: set[str] = set()
    for message in messages:
        blocks = message["content"]
        if not blocks:
            found.append(f"an empty {message['role']} message")
        if any(b["type"] == "text" and not b["text"].strip() for b in blocks):
            found.append("an empty text block")
        if message["role"] == "assistant":
            uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
            if seen_ids & set(uses) or len(set(uses)) != len(uses):
                found.append(f"a tool_use id used twice: {uses}")
            seen_ids |= set(uses)
            continue
        kinds = [b["type"] for b in blocks]
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        if sorted(results) != sorted(uses):
            found.append(f"tool_use {uses} answered by tool_result {results}")
        if "tool_result" in kinds[kinds.index("text") if "text" in kinds else len(kinds) :]:
            found.append("a text block before a tool_result block")
        uses = []
    return found


Op = tuple[str, int, bool]
ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["send", "deliver", "event", "step", "children", "tools", "sweep", "crash"]
        ),
        st.integers(min_value=0, max_value=9),
        st.booleans(),
    ),
    max_size=30,
)


def apply(h: Harness, root: str, op: Op) -> None:
    kind, n, flag = op
    calls = sorted(h.store.load(root).calls.values(), key=lambda c: (c.seq, c.call_id))
    target = calls[n % len(calls)].call_id if calls else "call_nope"
    with contextlib.suppress(DormantError):  # refused input is fine: it changes nothing
        match kind:
            case "send":
                h.send(root, f"user text {n}")
            case "deliver":  # message ids from a small pool: duplicates are likely
                h.deliver(root, target, f"result {n}", message_id=f"d{n % 3}-{target}")
            case "event":
                h.send_event(root, target, f"event {n}", associative=flag, message_id=f"e{n}")
            case "step":
                h.step(root)
            case "children":
                for thread_id in h.store.threads_to_wake(limit=100):
                    h.step(thread_id)
            case "tools":
                h.run_tools()
            case "sweep":
                h.sweep()
            case "crash":
                h.arm(POINTS[n % len(POINTS)])
                with contextlib.suppress(CrashPoint):  # a crash is what this step is for
                    h.run_tools() if flag else h.step(root)
                h.restart()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_every_request_any_interleaving_makes_is_one_both_providers_accept(
    steps: list[Op],
) -> None:
    model = CheckingModel()
    agent = Agent("a", model=ScriptedModel(model.script), tools=[build, add, watch], threads=True)
    h = Harness(agent)
    root = h.launch("a", "start")
    for op in steps:
        apply(h, root, op)
    assert model.violations == []


def test_the_checks_find_what_a_provider_refuses() -> None:
    """The rules above are not vacuous: each broken shape is found."""
    assert openai_violations(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            {"role": "user", "content": "more"},
        ]
    ) == ["a user message before the results of ['c1']"]
    assert anthropic_violations(
        [
            {"role": "user", "content": [{"type": "text", "text": "go"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c1"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "more"},
                    {"type": "tool_result", "tool_use_id": "c1"},
                ],
            },
        ]
    ) == ["a text block before a tool_result block"]
