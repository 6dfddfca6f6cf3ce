"""Passive calls (sleep, sleep_until, wait_for_event) and durable timers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from dormant import Agent
from dormant.messages import EventShown, Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.runtime.history import INTERRUPTED
from dormant.runtime.slice import Idle, Waiting
from dormant.stores.base import CallState
from tests.harness import Harness, results
from tests.test_history_rules import TOOLS


def scripted(*answers: Completion) -> Agent:
    it = iter(answers)
    return Agent("a", model=ScriptedModel(lambda items: next(it)), tools=TOOLS)


def test_sleep_starts_a_durable_timer_that_fires_once_and_wakes_the_thread() -> None:
    h = Harness(scripted(reply("", call("sleep", "s1", seconds=0)), reply("rested")))
    t = h.launch("a", "nap")
    assert isinstance(h.step(t), Waiting)
    h.sweep()
    h.sweep()  # a second sweep must not fire the timer again
    assert h.woken.count(t) == 2  # once for launch, once for the timer
    assert isinstance(h.step(t), Idle)
    assert results(h.history(t)) == [
        ToolResult(call_id="s1", name="sleep", content="Slept for 0 seconds.")
    ]


def test_a_future_timer_does_not_fire_early() -> None:
    h = Harness(scripted(reply("", call("sleep", "s1", seconds=3600))))
    t = h.launch("a", "nap")
    h.step(t)
    h.sweep()
    assert h.store.call(t, "s1").state is CallState.PENDING
    due = h.store.next_timer_due()
    assert due is not None and due > datetime.now(UTC) + timedelta(minutes=59)


def test_an_event_wakes_a_sleeping_thread_early_and_cancels_its_timer() -> None:
    h = Harness(
        scripted(
            reply("", call("watch_prs", "w1", repo="r")),
            reply("", call("sleep", "s1", seconds=3600)),
            reply("an event woke me"),
        )
    )
    t = h.launch("a", "watch then sleep")
    h.settle(t)
    assert h.store.call(t, "s1").state is CallState.PENDING
    h.send_event(t, "w1", "PR #1", associative=True)
    assert isinstance(h.step(t), Idle)
    kinds = [type(i).__name__ for i in h.history(t)[-3:]]
    assert kinds == ["ToolResult", "EventShown", "AssistantTurn"]
    assert h.store.next_timer_due() is None


def test_wait_for_event_is_answered_when_an_event_arrives() -> None:
    h = Harness(
        scripted(
            reply("", call("watch_prs", "w1", repo="r")),
            reply("", call("wait_for_event", "w2")),
            reply("got it"),
        )
    )
    t = h.launch("a", "watch and wait")
    outcome = h.settle(t)
    assert isinstance(outcome, Waiting) and outcome.call_ids == ("w2",)
    h.send_event(t, "w1", "PR #2", associative=True)
    assert isinstance(h.step(t), Idle)
    assert any(isinstance(i, EventShown) and i.content == "PR #2" for i in h.history(t))


def test_user_text_interrupts_a_sleep_and_its_timer_never_shows_up() -> None:
    def script(items: Sequence[Item]) -> Completion:
        users = sum(isinstance(i, UserText) for i in items)
        if isinstance(items[-1], UserText) and users == 1:
            return reply("", call("sleep", "s1", seconds=0))
        return reply("awake")

    h = Harness(Agent("a", model=ScriptedModel(script), tools=TOOLS))
    t = h.launch("a", "nap")
    h.step(t)
    h.send(t, "wake up")
    h.step(t)
    h.sweep()  # the cancelled timer must not fire
    h.step(t)
    assert [r.content for r in results(h.history(t))] == [INTERRUPTED]
    assert not any(isinstance(i, EventShown) for i in h.history(t))


def test_sleep_until_a_past_time_fires_at_once_and_a_bad_time_is_an_error() -> None:
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    h = Harness(
        scripted(
            reply("", call("sleep_until", "bad", iso_time="tomorrow-ish")),
            reply("", call("sleep_until", "ok", iso_time=past)),
            reply("done"),
        )
    )
    t = h.launch("a", "wait")
    h.step(t)
    h.sweep()
    h.step(t)
    first, second = results(h.history(t))
    assert first.is_error and "not an ISO 8601 time" in first.content
    assert second.call_id == "ok" and second.content.startswith("Woke up at the target time")


def test_timers_survive_a_restart_because_they_live_in_the_store() -> None:
    h = Harness(scripted(reply("", call("sleep", "s1", seconds=0)), reply("rested")))
    t = h.launch("a", "nap")
    h.step(t)
    fresh = Harness(*h.deps.agents.values(), store=h.store)  # a new process, same store
    fresh.sweep()
    assert isinstance(fresh.step(t), Idle)
    assert results(fresh.history(t))[0].call_id == "s1"
