"""What a running tool can do through its ToolContext."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.messages import EventShown, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.stores.base import CallState

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


def script(items: list[object]) -> object:
    last = items[-1]
    if isinstance(last, UserText) and "job" in last.text:
        return reply("", call("background_job", name="nightly"))
    if isinstance(last, UserText):
        return reply("", call("reminders", "r1", topic="standup"))
    if isinstance(last, ToolResult | EventShown):
        return reply(f"seen: {getattr(last, 'content', '')}")
    return reply("ok")


AGENT = Agent("a", model=ScriptedModel(script), tools=[background_job, reminders])  # type: ignore[arg-type]


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
