"""User text goes ahead of background work: in a slice's own re-wake and in LocalSystem's
pool (issue 11). The Celery queues are tested in tests/celery/test_celery_wake_priority.py."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.messages import Item, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.runtime.slice import Waiting
from dormant.runtime.sweeper import sweep_once
from dormant.stores.base import Priority, ThreadStatus
from tests.harness import Harness

callbacks: dict[str, str] = {}
hold_started = threading.Event()
hold_release = threading.Event()
completions: list[str] = []


@tool(deferred=True)
def start_job(name: str, ctx: ToolContext) -> None:
    """Start a job whose result arrives later."""
    callbacks[name] = ctx.callback_url


@tool
def hold() -> str:
    """Occupy a pool thread until the test lets go."""
    hold_started.set()
    assert hold_release.wait(timeout=60)
    return "held"


def _script(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText) and last.text.startswith("job"):
        return reply("starting", call("start_job", name=last.text))
    if isinstance(last, UserText) and last.text == "hold":
        return reply("holding", call("hold"))
    return reply("ok")


class _Recording(ScriptedModel):
    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        completions.append(request.thread_id)
        return super().complete(request, on_chunk)


AGENT = Agent("a", model=_Recording(_script), tools=[start_job, hold])


class _Wakes(Harness):
    def __init__(self, *agents: Agent) -> None:
        super().__init__(*agents)
        self.wakes: list[tuple[str, int]] = []

    def wake(self, thread_id: str, priority: int) -> bool:
        self.wakes.append((thread_id, priority))
        return True


def _waiting_thread(h: _Wakes) -> tuple[str, str]:
    t = h.launch("a", "job-1")
    outcome = h.step(t)
    assert isinstance(outcome, Waiting)
    return t, outcome.call_ids[0]


def test_a_slice_rewakes_its_thread_at_the_priority_of_what_arrived_meanwhile() -> None:
    arrivals: list[tuple[str, str]] = []
    h: _Wakes

    def script(items: Sequence[Item]) -> Completion:
        while arrivals:  # during the completion, something arrives for the thread
            kind, call_id = arrivals.pop()
            if kind == "result":
                h.deliver(t, call_id, "late result")
            else:
                h.send(t, "more user text")
        return _script(items)

    h = _Wakes(Agent("a", model=ScriptedModel(script), tools=[start_job]))
    t, call_id = _waiting_thread(h)
    h.send(t, "never mind")  # interrupts the call; its result will come late
    arrivals.append(("result", call_id))
    h.wakes.clear()
    h.step(t)
    assert h.wakes[-1:] == [(t, Priority.BACKGROUND)]  # a tool result: background

    arrivals.append(("user", ""))
    h.step(t)
    assert h.wakes[-1:] == [(t, Priority.INTERACTIVE)]  # user text: interactive


def test_local_system_runs_user_text_before_queued_tool_results() -> None:
    callbacks.clear()
    completions.clear()
    hold_started.clear()
    hold_release.clear()
    with LocalSystem([AGENT], "memory://", workers=1) as system:
        background = [system.launch("a", f"job-{n}") for n in range(4)]
        user = system.launch("a", "hello")
        system.run_until_idle(timeout_s=60)
        assert all(system.thread(t).status is ThreadStatus.WAITING for t in background)
        holder = system.launch("a", "hold")
        assert hold_started.wait(timeout=60)  # the one pool thread is busy in a tool now
        completions.clear()
        for name in sorted(callbacks):
            system.deliver_callback(callbacks[name], f"{name} finished")  # background wakes
        system.send(user, "urgent")  # user text, queued last
        hold_release.set()
        system.run_until_idle(timeout_s=60)
    assert completions[0] == user, completions
    assert sorted(completions[1:]) == sorted([*background, holder])


def test_the_sweeper_rewakes_each_thread_at_the_priority_of_its_waiting_rows() -> None:
    """A wake lost with the broker (Redis down during ``send``) is redone by the sweeper:
    user text at interactive priority, not queued behind background work."""
    h = _Wakes(AGENT)
    background, call_id = _waiting_thread(h)
    h.deliver(background, call_id, "done")
    interactive = h.launch("a", "hi")
    h.send(background, "and also this")  # its thread's highest row decides
    text_only = h.launch("a", "hello")
    h.wakes.clear()  # as if every one of those wakes had been lost

    sweep_once(h.store, h.lease, h, datetime.now(UTC), grace_s=60.0, lost_after_s=3600.0)

    assert sorted(h.wakes) == sorted(
        [
            (background, Priority.INTERACTIVE),
            (interactive, Priority.INTERACTIVE),
            (text_only, Priority.INTERACTIVE),
        ]
    )
    h.wakes.clear()
    h.drain()
    only_result, call_id = _waiting_thread(h)
    h.deliver(only_result, call_id, "done")
    h.wakes.clear()

    sweep_once(h.store, h.lease, h, datetime.now(UTC), grace_s=60.0, lost_after_s=3600.0)

    assert h.wakes == [(only_result, Priority.BACKGROUND)]
