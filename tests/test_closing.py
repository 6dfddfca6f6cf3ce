"""Closing a thread from outside (``close_thread`` on ``LocalSystem``), on every store.

A close answers what is pending, cancels subscriptions and timers, closes the children,
refuses later messages, stops a running slice, and keeps its reason; the sweeper closes
threads idle past their agent's limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import pytest

from dormant import Agent, LocalSystem, Settings, ToolContext, tool
from dormant.errors import ThreadClosed, UnknownThread
from dormant.messages import (
    AssistantTurn,
    EventShown,
    Item,
    Rejected,
    StatusChanged,
    ToolResult,
    UserMessage,
    UserText,
)
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.ops.check import check_store
from dormant.runtime.outcomes import Closed
from dormant.stores.base import CallState, InboxState, Priority, Snapshot, Store, ThreadStatus
from dormant.stores.memory.store import MemoryStore
from tests.conftest import StoreOpener
from tests.harness import Harness, poll

cancelled: list[str] = []


@tool(subscription=True, on_cancel=lambda ctx: cancelled.append(ctx.call_id))
def watch_prs(repo: str) -> str:
    """Subscribe to pull requests."""
    return f"watching {repo}"


@tool(deferred=True)
def run_build(target: str, ctx: ToolContext) -> None:
    """Start a build; the result arrives later."""


def _busy(items: Sequence[Item]) -> Completion:
    """A root that starts everything that can be pending at once; a child that sleeps."""
    first = items[0]
    last = items[-1]
    if isinstance(last, ToolResult) and last.content.startswith("You are now inside"):
        return reply("", call("sleep", seconds=3600))
    if isinstance(first, UserText) and isinstance(last, UserText):
        return reply(
            "on it",
            call("run_build", target="main"),
            call("watch_prs", repo="acme/app"),
            call("sleep", seconds=3600),
            call("spawn_thread", instructions="look around"),
        )
    return reply("noted")


def _settings(**overrides: float) -> Settings:
    return Settings(model_backoff_s=0.0, sweep_interval_s=0.05, **overrides)


@pytest.fixture
def busy(open_store: StoreOpener) -> Iterator[tuple[LocalSystem, str]]:
    """A root waiting on a deferred build, a subscription, a sleep and a sleeping child."""
    agent = Agent("busy", model=ScriptedModel(_busy), tools=[run_build, watch_prs], threads=True)
    with LocalSystem([agent], settings=_settings(), store=open_store()) as system:
        thread_id = system.launch("busy", "start everything")
        system.run_until_idle()
        yield system, thread_id


def test_closing_a_root_answers_its_calls_and_cancels_its_subscriptions_timers_and_children(
    busy: tuple[LocalSystem, str],
) -> None:
    system, root = busy
    calls = system.store.load(root).calls
    assert {c.name for c in calls.values() if c.state is CallState.PENDING} >= {
        "run_build",
        "sleep",
    }
    watch = next(c.call_id for c in calls.values() if c.name == "watch_prs")
    assert calls[watch].state is CallState.SUBSCRIBED
    assert system.store.next_timer_due() is not None  # the root's and the child's sleeps

    closed = system.close_thread(root, reason="the customer left")
    system.run_until_idle()

    assert closed.status is ThreadStatus.CLOSED
    assert system.thread(root).closed_reason == "the customer left"
    after = system.store.load(root).calls
    assert not [c for c in after.values() if c.state is CallState.PENDING]
    assert after[watch].state is CallState.CANCELLED
    assert watch in cancelled  # the subscription's cancel hook ran
    unanswered = [
        i for i in system.history(root) if isinstance(i, ToolResult) and i.content.startswith("Not")
    ]
    assert {r.name for r in unanswered} >= {"run_build", "sleep"}
    assert all(r.is_error for r in unanswered)
    (child,) = system.store.children(root)
    assert child.status is ThreadStatus.CLOSED
    assert child.closed_reason == f"its ancestor {root} was closed"
    assert system.store.next_timer_due() is None
    assert check_store(system.store) == []


def test_a_closed_thread_refuses_later_messages_naming_the_reason(
    busy: tuple[LocalSystem, str],
) -> None:
    system, root = busy
    build = next(c for c in system.store.load(root).calls.values() if c.name == "run_build")
    system.close_thread(root, reason="the customer left")

    with pytest.raises(ThreadClosed, match="the customer left"):
        system.send(root, "are you there?")
    with pytest.raises(ThreadClosed, match="the customer left"):
        system.deliver(root, build.call_id, "build green", message_id="ci-1")


def test_closing_a_thread_twice_changes_nothing_the_second_time(
    busy: tuple[LocalSystem, str],
) -> None:
    system, root = busy
    first = system.close_thread(root, reason="first")
    second = system.close_thread(root, reason="second")

    assert second.version == first.version
    assert second.closed_reason == "first"


def test_closing_a_child_tells_its_parent_and_the_parent_goes_on(
    busy: tuple[LocalSystem, str],
) -> None:
    system, root = busy
    (child,) = system.store.children(root)
    build = next(c for c in system.store.load(root).calls.values() if c.name == "run_build")

    system.close_thread(child.id, reason="not needed")
    system.run_until_idle()

    assert system.thread(child.id).status is ThreadStatus.CLOSED
    assert system.thread(root).status is ThreadStatus.WAITING  # its own calls still pending
    (report,) = [r for r in system.store.inbox(root) if r.message_id == f"closed:{child.id}"]
    assert report.state is InboxState.DEFERRED  # behind the build, like any child report
    system.deliver(root, build.call_id, "green")
    system.run_until_idle()
    told = [i for i in system.history(root) if isinstance(i, EventShown)]
    assert any(f"Child thread {child.id} was closed: not needed" in e.content for e in told)
    assert check_store(system.store) == []


def test_a_message_queued_before_the_close_is_rejected_with_the_reason(
    open_store: StoreOpener,
) -> None:
    agent = Agent("echo", model=ScriptedModel(lambda items: reply("ok")))
    quiet = Settings(model_backoff_s=0.0, sweep_interval_s=3600)  # nothing re-wakes it
    with LocalSystem([agent], settings=quiet, store=open_store()) as system:
        thread_id = system.launch("echo", "hello")
        system.run_until_idle()
        late = UserMessage(text="still there?")
        system.store.enqueue(thread_id, "late-1", late, Priority.INTERACTIVE)  # not woken

        system.close_thread(thread_id, reason="done here")

        (row,) = [r for r in system.store.inbox(thread_id) if r.message_id == "late-1"]
        assert row.state is InboxState.REJECTED
        assert "done here" in row.reason
        rejected = [e for e in system.events(thread_id) if isinstance(e, Rejected)]
        assert [e.message_id for e in rejected] == ["late-1"]


def test_closing_an_unknown_thread_raises_unknown_thread() -> None:
    with LocalSystem([], "memory://") as system, pytest.raises(UnknownThread):
        system.close_thread("thr_nope")


# a running slice ---------------------------------------------------------------------------


@dataclass
class _Streamer:
    """Streams a long reply chunk by chunk (``chunk_s`` apart) once the user says "slow";
    records how many chunks it sent and whether the slice stopped it."""

    chunk_s: float = 0.02
    chunks: int = 500
    name: str = "streamer"
    context_window: int = 128_000
    started: threading.Event = field(default_factory=threading.Event)
    sent: int = 0
    stopped_by: str = ""
    stopped_why: str = ""

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        last = request.items[-1]
        if not (isinstance(last, UserText) and last.text == "slow"):
            return reply("quick answer")
        self.started.set()
        try:
            for _ in range(self.chunks):
                time.sleep(self.chunk_s)
                on_chunk("word ")
                self.sent += 1
        except Exception as error:
            self.stopped_why = str(error)
            self.stopped_by = type(error).__name__
            raise
        return reply("word " * self.chunks)


def test_closing_a_thread_mid_slice_abandons_the_model_call_and_commits_nothing_of_it(
    open_store: StoreOpener,
) -> None:
    model = _Streamer()
    agent = Agent("streamer", model=model)
    settings = _settings(lease_ttl_s=0.6)  # renewed every 0.2 s while streaming
    with LocalSystem([agent], settings=settings, store=open_store()) as system:
        thread_id = system.launch("streamer", "hi")
        system.run_until_idle()
        before = system.history(thread_id)
        system.send(thread_id, "slow")
        assert model.started.wait(10)

        system.close_thread(thread_id, reason="stop now")
        poll(lambda: model.stopped_by != "")
        system.run_until_idle(timeout_s=20)

        assert model.stopped_by == "LeaseLost"
        # stopped by the close, and it says so: not "lost to another slice"
        assert model.stopped_why == (
            f"thread {thread_id!r} was closed (stop now): the slice stopped, nothing written"
        )
        assert model.sent < model.chunks  # it stopped streaming, well before the end
        assert system.history(thread_id) == before  # nothing of the abandoned slice
        assert not any(isinstance(i, AssistantTurn) and "word" in i.text for i in before)
        assert system.thread(thread_id).status is ThreadStatus.CLOSED
        assert check_store(system.store) == []


def test_closing_publishes_the_status_change_with_the_reason(
    busy: tuple[LocalSystem, str],
) -> None:
    system, root = busy
    system.close_thread(root, reason="bye")

    changes = [e for e in system.events(root) if isinstance(e, StatusChanged)]
    assert changes[-1].status == "closed" and changes[-1].detail == "bye"


# idle limit --------------------------------------------------------------------------------


def test_the_sweeper_closes_a_thread_idle_past_its_agents_limit_and_no_other(
    open_store: StoreOpener,
) -> None:
    short = Agent("short", model=ScriptedModel(lambda items: reply("ok")), close_after_idle_s=0.3)
    patient = Agent("patient", model=ScriptedModel(lambda items: reply("ok")))
    with LocalSystem([short, patient], settings=_settings(), store=open_store()) as system:
        brief = system.launch("short", "hello")
        kept = system.launch("patient", "hello")
        system.run_until_idle()

        poll(lambda: system.thread(brief).status is ThreadStatus.CLOSED)

        assert system.thread(brief).closed_reason == "idle for more than 0.3 s"
        assert system.thread(kept).status is ThreadStatus.IDLE
        assert check_store(system.store) == []


def test_an_idle_limit_never_closes_a_thread_waiting_on_a_call(open_store: StoreOpener) -> None:
    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText) and last.text == "build":
            return reply("", call("run_build", target="x"))
        return reply("done")

    agent = Agent("waiter", model=ScriptedModel(script), tools=[run_build], close_after_idle_s=0.1)
    with LocalSystem([agent], settings=_settings(), store=open_store()) as system:
        waiting = system.launch("waiter", "build")
        idle = system.launch("waiter", "chat")
        system.run_until_idle()

        poll(lambda: system.thread(idle).status is ThreadStatus.CLOSED)  # sweeps went by

        assert system.thread(waiting).status is ThreadStatus.WAITING


# a slice that commits between the close's read and its write -------------------------------


class _SliceBetween:
    """A store whose first ``load`` after ``arm()`` lets ``slice_once`` commit before it
    returns: the close that read it holds a stale version."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.slice_once: Callable[[], object] | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def load(self, thread_id: str) -> Snapshot:
        snap = self._store.load(thread_id)
        run, self.slice_once = self.slice_once, None
        if run is not None:
            run()
        return snap


def test_a_close_that_loses_the_race_to_a_slices_commit_reloads_and_closes_what_it_left() -> None:
    racing = _SliceBetween(MemoryStore())
    h = Harness(Agent("echo", model=ScriptedModel(lambda items: reply("answered"))))
    h.store = racing  # type: ignore[assignment]
    h.deps = replace(h.deps, store=racing)  # type: ignore[arg-type]
    thread_id = h.launch("echo", "hello")  # queued, not applied yet
    racing.slice_once = lambda: h.step(thread_id)

    closed = h.close_thread(thread_id, reason="racing")

    assert closed.status is ThreadStatus.CLOSED
    assert [type(i) for i in h.history(thread_id)] == [UserText, AssistantTurn]
    assert [r.state for r in h.store.inbox(thread_id)] == [InboxState.DONE]
    assert check_store(h.store) == []


def test_a_message_stored_between_a_closes_read_and_its_commit_is_rejected_visibly() -> None:
    racing = _SliceBetween(MemoryStore())
    h = Harness(Agent("echo", model=ScriptedModel(lambda items: reply("answered"))))
    h.store = racing  # type: ignore[assignment]
    h.deps = replace(h.deps, store=racing)  # type: ignore[arg-type]
    thread_id = h.launch("echo", "hello")
    h.settle(thread_id)
    racing.slice_once = lambda: h.send(thread_id, "one more thing", message_id="late")

    h.close_thread(thread_id, reason="done")
    h.step(thread_id)  # the slice the late message woke

    (row,) = [r for r in h.store.inbox(thread_id) if r.message_id == "late"]
    assert row.state is InboxState.REJECTED and "is closed" in row.reason
    assert any(isinstance(e, Rejected) and e.message_id == "late" for e in h.events(thread_id))
    assert check_store(h.store) == []


hooked: list[tuple[str, str]] = []


@tool(subscription=True, on_cancel=lambda ctx: hooked.append((ctx.thread_id, ctx.call_id)))
def watch_repo(repo: str) -> str:
    """Subscribe to a repository's pushes."""
    return f"watching {repo}"


def _subscriber(items: Sequence[Item]) -> Completion:
    """A subscriber whose build is still running when events come (its history has no
    safe point after the subscription), and event threads that close themselves."""
    last = items[-1]
    if isinstance(last, UserText):
        return reply("", call("watch_repo", "w1", repo="r"), call("run_build", "b1", target="x"))
    if isinstance(last, EventShown):
        return reply("", call("close_thread", report="seen"))
    return reply("ok")


@pytest.mark.parametrize("how", ["itself", "from outside", "with its subscriber"])
def test_an_event_thread_closing_never_runs_its_subscribers_cancel_hook(
    store: Store, how: str
) -> None:
    hooked.clear()
    agent = Agent("a", model=ScriptedModel(_subscriber), tools=[watch_repo, run_build])
    h = Harness(agent, store=store)
    t = h.launch("a", "watch")
    h.drain()
    for n in range(2):
        h.send_event(t, "w1", f"push {n}", message_id=f"push-{n}")
        h.step(t)
        event = h.store.children(t)[-1]
        assert event.metadata["role"] == "event"
        if how == "from outside":
            h.close_thread(event.id)
        elif how == "itself":
            h.drain()
        assert h.store.thread(event.id).status is ThreadStatus.CLOSED or how != "itself"
        h.run_tools()
        assert hooked == []  # the subscription is its subscriber's, and still live
        assert h.store.call(t, "w1").state is CallState.SUBSCRIBED
    if how == "with its subscriber":
        h.close_thread(t)
        h.run_tools()
        assert hooked == [(t, "w1")]  # once, for the subscriber only


def test_a_slice_whose_commit_a_close_beat_ends_closed_not_stale(store: Store) -> None:
    """A close between a slice's load and its commit moves the version: the slice's
    outcome says the thread was closed, not that another slice took it."""
    h: Harness

    def closes_meanwhile(items: Sequence[Item]) -> Completion:
        h.close_thread(t, reason="the customer left")
        return reply("too late")

    h = Harness(Agent("a", model=ScriptedModel(closes_meanwhile)), store=store)
    t = h.launch("a", "hi")
    assert isinstance(h.step(t), Closed)
    assert h.history(t) == []  # nothing of the slice was written
    assert h.store.thread(t).closed_reason == "the customer left"
