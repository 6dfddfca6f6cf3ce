"""Retention after real runs, on every store: prune frees what users made and nothing
else, and a message whose inbox row was pruned is still recognized when it comes again."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import func, select

from dormant import Agent, LocalSystem, Settings, ToolContext, tool
from dormant.callbacks import callback_app
from dormant.errors import DuplicateMessage, MessageRejected, UnknownThread
from dormant.messages import AssistantTurn, EventShown, Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.ops.check import check_store
from dormant.ops.prune import prune
from dormant.stores.base import InboxState, Store, ThreadStatus
from dormant.stores.sql.store import SQLStore
from tests.conftest import StoreOpener
from tests.harness import poll

callbacks: dict[str, str] = {}


@tool(deferred=True)
def run_build(target: str, ctx: ToolContext) -> None:
    """Start a build; the result arrives through the callback URL."""
    callbacks[ctx.thread_id] = ctx.callback_url


@tool(subscription=True)
def watch_prs(repo: str) -> str:
    """Watch pull requests."""
    return f"watching {repo}"


def _script(items: Sequence[Item]) -> Completion:
    """ "family": a child that reports and closes; "build": a deferred tool; "both": the
    two at once; "watch": a subscription whose threaded events report and close; anything
    else: a reply."""
    last = items[-1]
    if isinstance(last, UserText):
        match last.text:
            case "family":
                return reply("", call("spawn_thread", instructions="look"))
            case "build":
                return reply("", call("run_build", target="main"))
            case "watch":
                return reply("", call("watch_prs", repo="acme/app"))
            case "both":
                return reply(
                    "", call("spawn_thread", instructions="look"), call("run_build", target="x")
                )
        return reply("ok")
    if isinstance(last, ToolResult) and last.content.startswith("You are now inside"):
        return reply("", call("close_thread", report="found it"))
    if isinstance(last, ToolResult) and last.name == "receive_event__injected":
        return reply("", call("close_thread", report="saw an event"))
    if isinstance(last, EventShown):
        return reply("noted")
    return reply("done")


AGENT = Agent("worker", model=ScriptedModel(_script), tools=[run_build, watch_prs], threads=True)


SETTINGS = Settings(model_backoff_s=0.0, secret_keys=("k1",))


@pytest.fixture
def system(open_store: StoreOpener) -> Iterator[LocalSystem]:
    with LocalSystem([AGENT], settings=SETTINGS, store=open_store()) as running:
        yield running


@pytest.fixture
def restarted(open_store: StoreOpener) -> Iterator[Callable[[], LocalSystem]]:
    """Another process on the same database: its fast path (the dedup set of recently
    applied ids, lost with Redis or a restart) knows nothing, so only the store answers."""
    opened: list[LocalSystem] = []

    def start() -> LocalSystem:
        opened.append(LocalSystem([AGENT], settings=SETTINGS, store=open_store()))
        return opened[-1]

    yield start
    for again in opened:
        again.close()


def _prune_everything_finished(store: Store) -> None:
    """Retention with a cutoff just ahead of now: every finished row and closed thread."""
    prune(store, datetime.now(UTC) + timedelta(seconds=1), batch=2)


def _rows_of(store: Store, thread_ids: set[str]) -> int:
    """Rows left anywhere for these threads (SQL), or whether the memory store knows them."""
    if not isinstance(store, SQLStore):
        known = 0
        for thread_id in thread_ids:
            try:
                store.thread(thread_id)
                known += 1
            except UnknownThread:
                pass
        return known
    schema = store._schema  # a test looks into every table
    with store._engine.connect() as conn:
        total = 0
        for table in schema.metadata.sorted_tables:
            column = table.c.get("thread_id", table.c.get("id"))
            total += conn.execute(
                select(func.count()).select_from(table).where(column.in_(thread_ids))
            ).scalar_one()
        return total


def test_prune_after_a_real_run_removes_the_closed_threads_and_nothing_else(
    system: LocalSystem,
) -> None:
    done = system.launch("worker", "family")
    kept = system.launch("worker", "family")
    system.run_until_idle()
    system.close_thread(done, reason="finished")
    system.run_until_idle()
    (kept_child,) = system.store.children(kept)
    (done_child,) = system.store.children(done)
    assert kept_child.status is ThreadStatus.CLOSED  # it reported and closed itself
    history = system.history(kept)
    assert any(isinstance(i, EventShown) for i in history)  # its report was applied

    _prune_everything_finished(system.store)

    assert _rows_of(system.store, {done, done_child.id, kept_child.id}) == 0
    assert system.thread(kept).status is ThreadStatus.IDLE
    assert system.history(kept) == history
    assert check_store(system.store) == []
    system.send(kept, "still here?")
    system.run_until_idle()
    assert system.history(kept)[-1] == AssistantTurn(text="ok")


def test_a_closed_child_is_pruned_only_once_its_parent_applied_its_report(
    system: LocalSystem,
) -> None:
    root = system.launch("worker", "both")
    system.run_until_idle()
    (child,) = system.store.children(root)
    assert child.status is ThreadStatus.CLOSED
    (report,) = [r for r in system.store.inbox(root) if r.message.kind == "report"]
    assert report.state is InboxState.DEFERRED  # the parent still waits on its build

    _prune_everything_finished(system.store)

    assert [c.id for c in system.store.children(root)] == [child.id]
    build = next(c for c in system.store.load(root).calls.values() if c.name == "run_build")
    system.deliver(root, build.call_id, "green")
    system.run_until_idle()
    _prune_everything_finished(system.store)
    assert system.store.children(root) == []
    assert any(isinstance(i, EventShown) and "found it" in i.content for i in system.history(root))
    assert check_store(system.store) == []


def test_a_retried_callback_whose_row_was_pruned_is_still_a_duplicate(
    system: LocalSystem, restarted: Callable[[], LocalSystem]
) -> None:
    thread_id = system.launch("worker", "build")
    system.run_until_idle()
    path = "/" + callbacks[thread_id].split("/", 3)[3]
    body = {"result": "green", "message_id": "ci-1"}
    transport = httpx.WSGITransport(app=callback_app(system))
    with httpx.Client(transport=transport, base_url="http://cb") as http:
        assert http.post(path, json=body).status_code == 202
    system.run_until_idle()
    _prune_everything_finished(system.store)
    assert system.store.inbox(thread_id) == []

    transport = httpx.WSGITransport(app=callback_app(restarted()))
    with httpx.Client(transport=transport, base_url="http://cb") as http:
        again = http.post(path, json=body)

    assert again.status_code == 200 and again.json()["status"] == "duplicate"


def test_a_retried_launch_whose_row_was_pruned_returns_the_same_thread(
    system: LocalSystem, restarted: Callable[[], LocalSystem]
) -> None:
    thread_id = system.launch("worker", "hello", thread_id="thr_order_42")
    system.run_until_idle()
    _prune_everything_finished(system.store)
    assert system.store.inbox(thread_id) == []
    before = system.history(thread_id)
    again = restarted()

    assert again.launch("worker", "hello", thread_id="thr_order_42") == thread_id
    again.run_until_idle()

    assert again.history(thread_id) == before
    with pytest.raises(MessageRejected, match="other text"):
        again.launch("worker", "goodbye", thread_id="thr_order_42")


def test_a_resent_threaded_event_whose_row_was_pruned_is_a_duplicate_and_runs_nothing(
    system: LocalSystem, restarted: Callable[[], LocalSystem]
) -> None:
    thread_id = system.launch("worker", "watch")
    system.run_until_idle()
    watch = next(c for c in system.store.load(thread_id).calls.values() if c.name == "watch_prs")
    system.send_event(thread_id, watch.call_id, "PR #7 opened", message_id="gh-7")
    system.run_until_idle()
    (event_thread,) = system.store.children(thread_id)
    assert event_thread.status is ThreadStatus.CLOSED
    _prune_everything_finished(system.store)
    assert system.store.children(thread_id) == []
    assert system.store.inbox(thread_id, InboxState.DONE) == []
    again = restarted()

    with pytest.raises(DuplicateMessage):
        again.send_event(thread_id, watch.call_id, "PR #7 opened", message_id="gh-7")
    again.run_until_idle()

    assert again.store.children(thread_id) == []  # no second event thread ran


def test_local_system_prunes_closed_threads_past_prune_older_than_s(
    open_store: StoreOpener,
) -> None:
    settings = Settings(
        model_backoff_s=0.0, sweep_interval_s=0.05, prune_older_than_s=0.2, prune_interval_s=0.1
    )
    with LocalSystem([AGENT], settings=settings, store=open_store()) as system:
        gone = system.launch("worker", "hello")
        kept = system.launch("worker", "hello")
        system.run_until_idle()
        system.close_thread(gone, reason="done")

        def pruned() -> bool:
            try:
                system.thread(gone)
            except UnknownThread:
                return True
            return False

        poll(pruned)

        assert system.thread(kept).status is ThreadStatus.IDLE
