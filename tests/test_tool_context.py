"""What a running tool can do through its ToolContext."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.messages import AssistantTurn, EventShown, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.stores.base import CallState, InboxState

later: list[ToolContext] = []


@tool(deferred=True)
def background_job(name: str, ctx: ToolContext) -> None:
    """Start a job that answers later through the context (no HTTP involved)."""
    later.append(ctx)


@tool(subscription=True)
def reminders(topic: str, ctx: ToolContext) -> str:
    """Subscribe to reminders; the first one is scheduled at once for the past."""
    ctx.schedule(f"reminder about {topic}", datetime.now(UTC) - timedelta(seconds=1))
    ctx.schedule("far future reminder", datetime.now(UTC) + timedelta(days=30))
    return f"reminders on {topic}"


@tool
def set_reminder(text: str, in_s: float, ctx: ToolContext) -> str:
    """A plain tool that answers at once and schedules a message for later."""
    ctx.schedule(text, datetime.now(UTC) + timedelta(seconds=in_s))
    return f"reminder set in {in_s} s"


def script(items: list[object]) -> object:
    last = items[-1]
    if isinstance(last, UserText) and last.text.startswith("set "):
        return reply("", call("set_reminder", text="check the oven", in_s=0.3))
    if isinstance(last, UserText) and "job" in last.text:
        return reply("", call("background_job", name="nightly"))
    if isinstance(last, UserText):
        return reply("", call("reminders", "r1", topic="standup"))
    if isinstance(last, ToolResult | EventShown):
        return reply(f"seen: {getattr(last, 'content', '')}")
    return reply("ok")


AGENT = Agent(
    "a",
    model=ScriptedModel(script),  # type: ignore[arg-type]
    tools=[background_job, reminders, set_reminder],
)


def test_a_deferred_tool_answers_later_through_send_result_from_another_thread() -> None:
    later.clear()
    with LocalSystem([AGENT], "memory://") as system:
        thread_id = system.launch("a", "run the job")
        system.run_until_idle()
        (ctx,) = later
        assert ctx.thread_id == thread_id and ctx.callback_url.startswith("http")
        worker = threading.Thread(target=ctx.send_result, args=("job finished",))
        worker.start()
        worker.join()
        ctx.send_result("a second answer is ignored")  # same message id: a duplicate
        system.run_until_idle()
        results = [i for i in system.history(thread_id) if isinstance(i, ToolResult)]
        assert [r.content for r in results] == ["job finished"]
        assert system.store.call(thread_id, ctx.call_id).state is CallState.ANSWERED


def test_schedule_delivers_a_durable_event_on_the_call_when_due() -> None:
    with LocalSystem([AGENT], "memory://") as system:
        thread_id = system.launch("a", "remind me")
        system.run_until_idle()
        children = system.store.children(thread_id)  # the due reminder: a threaded event
        assert len(children) == 1
        seen = [i for i in system.history(children[0].id) if isinstance(i, EventShown)]
        assert [e.content for e in seen] == ["reminder about standup"]
        assert system.store.next_timer_due() is not None  # the far one waits in the store


def _shown(system: LocalSystem, thread_id: str) -> list[EventShown]:
    return [i for i in system.history(thread_id) if isinstance(i, EventShown)]


def test_a_plain_tool_schedule_reaches_the_model_when_due_after_its_call_was_answered() -> None:
    with LocalSystem([AGENT], "memory://") as system:
        thread_id = system.launch("a", "set a reminder")
        system.run_until_idle()
        call_id = next(i for i in system.history(thread_id) if isinstance(i, ToolResult)).call_id
        assert system.store.call(thread_id, call_id).state is CallState.ANSWERED
        deadline = time.monotonic() + 10.0
        while not _shown(system, thread_id):  # the timer is due 0.3 s after the call
            assert time.monotonic() < deadline, "the scheduled message never arrived"
            system.run_until_idle()
        (shown,) = _shown(system, thread_id)
        assert (shown.original_call_id, shown.original_name) == (call_id, "set_reminder")
        assert shown.content == "check the oven"
        last = system.history(thread_id)[-1]
        assert isinstance(last, AssistantTurn) and last.text == "seen: check the oven"
        assert system.store.children(thread_id) == []  # on the thread itself, not a child
        assert system.store.call(thread_id, call_id).state is CallState.ANSWERED
        assert system.store.inbox(thread_id, InboxState.REJECTED) == []


def test_a_deferred_tool_schedule_due_before_its_answer_is_shown_after_it() -> None:
    later.clear()
    with LocalSystem([AGENT], "memory://") as system:
        thread_id = system.launch("a", "run the job")
        system.run_until_idle()
        (ctx,) = later
        ctx.schedule("job still running?", datetime.now(UTC) - timedelta(seconds=1))
        system.run_until_idle()  # due while the call waits: held back, not refused
        assert _shown(system, thread_id) == []
        ctx.send_result("job finished")
        system.run_until_idle()
        shown = [
            getattr(i, "content", None) or getattr(i, "text", "") for i in system.history(thread_id)
        ]
        assert shown[-3:] == ["job finished", "job still running?", "seen: job still running?"]
        assert system.store.inbox(thread_id, InboxState.REJECTED) == []
