"""Poison messages are quarantined and retryable; limits are refused or recorded."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from dormant import Agent, ToolContext, tool
from dormant.errors import InboxFull, ModelFatal, ModelRetryable, UnknownMessage
from dormant.messages import AssistantTurn, Item, Rejected, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.ops.check import check_store
from dormant.runtime.slice import Failed, Idle, Waiting
from dormant.settings import Settings
from dormant.stores.base import RETRIED_MARK, InboxState, ThreadStatus
from tests.harness import Harness


def settings(**overrides: object) -> Settings:
    base = Settings(
        model_attempts=1, model_backoff_s=0.0, stall_after_failures=5, quarantine_after_failures=3
    )
    return base.with_(**overrides)


class Poisonable:
    """Fails (a bug in the agent's code, say) whenever user text contains ``poison``."""

    def __init__(self) -> None:
        self.cured = False

    def __call__(self, history: Sequence[Item]) -> Completion:
        texts = [i.text for i in history if isinstance(i, UserText)]
        if not self.cured and any("poison" in t for t in texts):
            raise KeyError("choices")
        return reply(f"read: {texts[-1]}")


def texts(h: Harness, thread_id: str) -> list[str]:
    return [i.text for i in h.history(thread_id) if isinstance(i, UserText)]


def test_a_poison_message_is_quarantined_and_the_thread_goes_on_with_its_next_message() -> None:
    script = Poisonable()
    h = Harness(Agent("a", model=ScriptedModel(script)), settings=settings())
    t = h.launch("a", "poison pill")
    h.send(t, "a fine question", message_id="fine")
    first = h.step(t)  # both messages at once: nobody knows which one is to blame
    assert isinstance(first, Failed) and first.quarantined is None
    second = h.step(t)  # the oldest alone
    assert isinstance(second, Failed) and second.quarantined is None
    third = h.step(t)
    assert isinstance(third, Failed) and third.quarantined == f"launch:{t}"
    assert "KeyError" in third.error and not third.stalled
    assert h.woken.count(t) >= 2  # the thread's other input is woken at once
    assert isinstance(h.step(t), Idle)
    assert texts(h, t) == ["a fine question"]
    (row,) = h.store.inbox(t, InboxState.QUARANTINED)
    assert row.message_id == f"launch:{t}" and "KeyError: 'choices'" in row.reason
    assert [r.message_id for r in h.store.quarantined()] == [row.message_id]
    assert any(isinstance(e, Rejected) and e.message_id == row.message_id for e in h.events(t))
    assert h.thread(t).status is ThreadStatus.IDLE and h.thread(t).failures == 0


def test_retry_puts_a_quarantined_message_back_and_the_checker_accepts_its_late_place() -> None:
    script = Poisonable()
    h = Harness(Agent("a", model=ScriptedModel(script)), settings=settings())
    t = h.launch("a", "poison pill")
    h.send(t, "a fine question")
    for _ in range(3):
        h.step(t)
    h.step(t)
    with pytest.raises(UnknownMessage):
        h.retry(t, "no-such-message")
    script.cured = True
    h.retry(t, f"launch:{t}")
    assert isinstance(h.step(t), Idle)
    assert texts(h, t) == ["a fine question", "poison pill"]
    (row,) = [r for r in h.store.inbox(t) if r.message_id == f"launch:{t}"]
    assert row.state is InboxState.DONE and row.reason.startswith(RETRIED_MARK)
    assert check_store(h.store, grace_s=0) == []


def test_a_provider_outage_quarantines_nothing_and_stalls_the_thread() -> None:
    def down(history: Sequence[Item]) -> Completion:
        raise ModelRetryable("HTTP 503 from provider")

    h = Harness(Agent("a", model=ScriptedModel(down)), settings=settings())
    t = h.launch("a", "hello")
    outcomes = [h.step(t) for _ in range(5)]
    assert all(isinstance(o, Failed) and o.quarantined is None for o in outcomes)
    assert h.thread(t).status is ThreadStatus.STALLED
    assert h.store.quarantined() == []


@pytest.mark.parametrize(("status", "quarantined"), [(400, True), (401, False), (None, False)])
def test_only_a_provider_refusing_the_request_blames_the_message(
    status: int | None, quarantined: bool
) -> None:
    def refuse(history: Sequence[Item]) -> Completion:
        raise ModelFatal(f"provider returned HTTP {status}", status=status)

    h = Harness(Agent("a", model=ScriptedModel(refuse)), settings=settings())
    t = h.launch("a", "hello")
    outcomes = [h.step(t) for _ in range(3)]
    failed = [o for o in outcomes if isinstance(o, Failed)]
    assert (failed[-1].quarantined is not None) is quarantined
    assert bool(h.store.quarantined()) is quarantined
    # A provider refusing the deployment stalls the thread at its first failure instead.
    assert (h.thread(t).status is ThreadStatus.STALLED) is not quarantined


@tool(deferred=True)
def run_build(target: str, ctx: ToolContext) -> None:
    """Start a build; the result arrives later."""


def test_a_result_for_a_pending_call_is_never_quarantined_the_thread_stalls_instead() -> None:
    def script(history: Sequence[Item]) -> Completion:
        if any(isinstance(i, ToolResult) for i in history):
            raise ValueError("cannot read this result")
        if any(isinstance(i, AssistantTurn) for i in history):
            return reply("still waiting")
        return reply("building", call("run_build", target="main"))

    h = Harness(Agent("a", model=ScriptedModel(script), tools=[run_build]), settings=settings())
    t = h.launch("a", "build main")
    outcome = h.step(t)
    assert isinstance(outcome, Waiting)
    h.deliver(t, outcome.call_ids[0], "green")
    results = [h.step(t) for _ in range(5)]
    assert all(isinstance(o, Failed) and o.quarantined is None for o in results)
    assert h.thread(t).status is ThreadStatus.STALLED
    assert h.store.quarantined() == []
    assert [r.state for r in h.store.inbox(t)][-1] is InboxState.PENDING


def test_a_slice_past_its_deadline_is_abandoned_and_recorded() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    ticks = iter(range(1000))

    def clock() -> datetime:  # each look at the clock is a minute later
        return start + timedelta(minutes=next(ticks))

    h = Harness(
        Agent("a", model=ScriptedModel(lambda _h: reply("slow answer"))),
        settings=settings(slice_deadline_s=90.0),
    )
    h.deps = replace(h.deps, clock=clock)
    t = h.launch("a", "hello")
    outcome = h.step(t)
    assert isinstance(outcome, Failed) and "SliceDeadlineExceeded" in outcome.error
    assert h.history(t) == []
    assert [r.state for r in h.store.inbox(t)] == [InboxState.PENDING]


def test_a_history_past_its_limit_fails_the_slice_with_the_size() -> None:
    h = Harness(
        Agent("a", model=ScriptedModel(lambda _h: reply("ok"))),
        settings=settings(max_history_bytes=1500),
    )
    t = h.launch("a", "x" * 1000)
    assert isinstance(h.step(t), Idle)
    h.send(t, "y" * 1000)
    outcome = h.step(t)
    assert isinstance(outcome, Failed) and "HistoryTooLarge" in outcome.error
    assert "limit is 1500" in outcome.error
    later = [h.step(t) for _ in range(4)]  # the thread's size, not a message: no quarantine
    assert all(isinstance(o, Failed) and o.quarantined is None for o in later)
    assert h.thread(t).status is ThreadStatus.STALLED


def test_a_full_inbox_refuses_user_text_but_never_a_tool_result() -> None:
    def script(history: Sequence[Item]) -> Completion:
        return reply("building", call("run_build", target="main"))

    h = Harness(
        Agent("a", model=ScriptedModel(script), tools=[run_build]),
        settings=settings(max_inbox_depth=2),
    )
    t = h.launch("a", "build main")
    outcome = h.step(t)
    assert isinstance(outcome, Waiting)
    h.send(t, "one")
    h.send(t, "two")
    with pytest.raises(InboxFull, match="already has 2 messages waiting"):
        h.send(t, "three")
    h.deliver(t, outcome.call_ids[0], "green")  # a call always gets its result
    assert len(h.store.inbox(t, InboxState.PENDING)) == 3


def test_run_until_idle_reports_a_quarantined_message() -> None:
    from dormant import LocalSystem
    from dormant.errors import ThreadsFailed

    config = settings(failure_backoff_s=0.01, sweep_interval_s=0.05)
    agent = Agent("a", model=ScriptedModel(Poisonable()))
    with LocalSystem([agent], "memory://", settings=config) as system:
        t = system.launch("a", "poison pill")
        system.send(t, "a fine question")
        deadline = time.monotonic() + 60
        while not system.store.quarantined():  # each run ends when the thread backs off
            assert time.monotonic() < deadline, f"nothing quarantined: {system.thread(t)}"
            system.run_until_idle(timeout_s=60, raise_on_failure=False)
        with pytest.raises(ThreadsFailed, match=f"message 'launch:{t}' quarantined"):
            system.run_until_idle(timeout_s=60)
        assert [i.text for i in system.history(t) if isinstance(i, UserText)] == ["a fine question"]


def test_quarantine_at_the_stall_threshold_is_off_and_the_thread_stalls_first() -> None:
    """``quarantine_after_failures`` must be below ``stall_after_failures``: at or above it,
    the operator decides (the thread stalls with the message still queued)."""
    h = Harness(
        Agent("a", model=ScriptedModel(Poisonable())), settings=settings(stall_after_failures=3)
    )
    t = h.launch("a", "poison pill")
    outcomes = [h.step(t) for _ in range(3)]
    assert all(isinstance(o, Failed) and o.quarantined is None for o in outcomes)
    assert isinstance(outcomes[-1], Failed) and outcomes[-1].stalled
    assert h.thread(t).status is ThreadStatus.STALLED
    assert h.store.quarantined() == []
    assert [r.message_id for r in h.store.inbox(t, InboxState.PENDING)] == [f"launch:{t}"]
