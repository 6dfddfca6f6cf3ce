"""Replays (``client.replay``, ``dormant/replay/``) on every store: recorded tool results
served without running a tool, recorded user text fed one per turn, the model live."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from dormant import Agent, LocalSystem, ReplayTools, Settings, ToolContext, tool
from dormant.cli import app
from dormant.errors import DuplicateMessage, InvalidForkPoint
from dormant.messages import (
    AssistantTurn,
    EventShown,
    Item,
    ToolCall,
    ToolResult,
    UserMessage,
    UserText,
)
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.models.registry import register_provider
from dormant.ops.check import check_store
from dormant.replay.agent import replayed
from dormant.replay.batch import pick_sources, replay_batch
from dormant.replay.tools import MISS_PREFIX
from dormant.runtime.history import WOKEN_BY_EVENT
from dormant.stores.base import NewThread, Priority, Store, StoredItem, ThreadStatus
from dormant.stores.memory.store import MemoryStore
from dormant.stores.sql.store import SQLStore
from dormant.tools.http import http_tool
from dormant.tools.mcp import McpServer, McpTool
from tests.conftest import StoreOpener
from tests.harness import Harness

ran: dict[str, int] = {"lookup": 0, "refund": 0, "start_job": 0, "add": 0}


@tool
def lookup(order: int) -> str:
    """Look an order up."""
    ran["lookup"] += 1
    return f"order {order} shipped"


@tool
def refund(order: int) -> str:
    """Refund an order (a side effect)."""
    ran["refund"] += 1
    return f"order {order} refunded"


@tool(deferred=True)
def start_job(name: str, ctx: ToolContext) -> None:
    """Start a job elsewhere; its result arrives later."""
    ran["start_job"] += 1
    ctx.send_result(f"job {name} done")


@tool(side_effect_free=True)
def add(a: int, b: int) -> str:
    """Add two numbers: changes nothing anywhere."""
    ran["add"] += 1
    return str(a + b)


def _script(items: Sequence[Item], *, refund_instead: bool = False, offset: int = 0) -> Completion:
    last = items[-1]
    if isinstance(last, UserText):
        word, _, number = last.text.partition(" ")
        if word == "job":
            return reply("starting", call("start_job", name=number))
        n = int(number) + offset
        if word == "order":
            name = "refund" if refund_instead else "lookup"
            return reply("looking", call(name, order=n))
        if word == "add":
            return reply("adding", call("add", a=n, b=1))
        return reply(f"you said {last.text}")
    assert isinstance(last, ToolResult)
    return reply(f"answer: {last.content}")


register_provider("replaytest", lambda name: _MODELS[name])
_MODELS = {
    "same": ScriptedModel(_script),
    "refunds": ScriptedModel(lambda items: _script(items, refund_instead=True)),
    "off_by_one": ScriptedModel(lambda items: _script(items, offset=1)),
}
AGENT = Agent("support", model=ScriptedModel(_script), tools=[lookup, refund, start_job, add])


@pytest.fixture(autouse=True)
def _reset_counters() -> None:
    for name in ran:
        ran[name] = 0


def _settings() -> Settings:
    return Settings(model_backoff_s=0.0, sweep_interval_s=0.05)


def _recorded(system: LocalSystem, *texts: str) -> str:
    thread_id = system.launch("support", texts[0])
    system.run_until_idle()
    for more in texts[1:]:
        system.send(thread_id, more)
        system.run_until_idle()
    return thread_id


def _after_fork(system: LocalSystem | Harness, thread_id: str) -> list[Item]:
    fork = system.thread(thread_id).fork_seq or 0
    return [s.item for s in system.stored_history(thread_id, full=True) if s.seq > fork]


def _shape(items: list[Item]) -> list[object]:
    """Items without their call ids (a live model makes fresh ones)."""
    shaped: list[object] = []
    for item in items:
        if isinstance(item, AssistantTurn):
            shaped.append((item.text, [(c.name, c.args) for c in item.calls]))
        elif isinstance(item, ToolResult):
            shaped.append((item.name, item.content, item.is_error))
        elif isinstance(item, EventShown):
            shaped.append((item.original_name, item.original_args, item.content))
        else:
            shaped.append(item)
    return shaped


def _outbox_rows(store: Store, thread_id: str) -> int | None:
    """Outbox rows of the thread, on SQL (memory drops the rows a worker ran)."""
    if not isinstance(store, SQLStore):
        return None
    url = str(store._engine.url.render_as_string(hide_password=False))
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            query = text("select count(*) from outbox where thread_id = :t")
            return int(conn.execute(query, {"t": thread_id}).scalar_one())
    finally:
        engine.dispose()


def test_a_replay_with_the_same_model_repeats_the_source_and_runs_no_tool(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "order 1", "job build", "order 2")
        assert ran == {"lookup": 2, "refund": 0, "start_job": 1, "add": 0}
        replay = system.replay(source, model="replaytest:same", tag="exp1")
        system.run_until_idle()

        assert _shape(_after_fork(system, replay)) == _shape(system.history(source, full=True))
        assert ran == {"lookup": 2, "refund": 0, "start_job": 1, "add": 0}  # nothing ran again
        assert _outbox_rows(system.store, replay) in (None, 0)
        info = system.thread(replay)
        assert info.status is ThreadStatus.IDLE and info.source_id == source
        assert info.metadata["replay"]["tag"] == "exp1"
        assert info.metadata["replay"]["code_version"] == system.thread(source).code_version
        assert info.metadata["tenant"] == "replay:exp1"  # its own admission flow
        assert {r.priority for r in system.store.inbox(replay)} == {Priority.BACKGROUND}
        assert check_store(system.store) == []


def test_a_replay_never_runs_a_side_effecting_tool_its_changed_model_calls(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "order 1")
        replay = system.replay(source, model="replaytest:refunds")
        system.run_until_idle()

        assert ran["refund"] == 0
        result = _after_fork(system, replay)[2]
        assert isinstance(result, ToolResult) and result.is_error
        assert result.content.startswith(MISS_PREFIX + 'refund({"order":1}) #1')
        assert _outbox_rows(system.store, replay) in (None, 0)


def test_a_replay_feeds_recorded_user_text_one_per_turn_in_order(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "hello 1", "hello 2", "hello 3")
        replay = system.replay(source, from_seq=3, model="replaytest:same")
        system.run_until_idle()

        assert system.history(replay) == [
            UserText(text="hello 1"),
            AssistantTurn(text="you said hello 1"),
            UserText(text="hello 2"),
            AssistantTurn(text="you said hello 2"),
            UserText(text="hello 3"),
            AssistantTurn(text="you said hello 3"),
        ]
        assert system.thread(replay).fork_seq == 2


def test_live_on_a_miss_runs_only_a_tool_declared_free_of_side_effects(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "order 1", "add 1")
        replay = system.replay(
            source, model="replaytest:off_by_one", tools=ReplayTools(on_miss="live")
        )
        system.run_until_idle()

        results = [i for i in _after_fork(system, replay) if isinstance(i, ToolResult)]
        assert [(r.name, r.is_error) for r in results] == [("lookup", True), ("add", False)]
        assert "not declared side_effect_free" in results[0].content
        assert results[1].content == "3"  # run live: add(2, 1)
        assert ran == {"lookup": 1, "refund": 0, "start_job": 0, "add": 2}


def test_a_replay_of_new_instructions_alone_runs_the_source_agents_model(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "order 1")
        replay = system.replay(source, instructions="Answer in one word.")
        info = system.thread(replay)
        assert info.metadata["replay"]["model"] is None  # stored as none, not as ""
        agent = replayed(AGENT, info, system.store)
        assert agent.model is AGENT.model
        assert agent.instructions == "Answer in one word."
        system.run_until_idle()
        assert _shape(_after_fork(system, replay)) == _shape(system.history(source, full=True))


def test_stop_on_a_miss_closes_the_replay_there(open_store: StoreOpener) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "order 1", "order 2")
        replay = system.replay(
            source, model="replaytest:refunds", tools=ReplayTools(on_miss="stop")
        )
        system.run_until_idle()

        assert system.thread(replay).status is ThreadStatus.CLOSED
        texts = [i for i in _after_fork(system, replay) if isinstance(i, UserText)]
        assert texts == [UserText(text="order 1")]  # order 2 was never fed
        assert ran["refund"] == 0


def test_matching_by_name_serves_the_recorded_result_whatever_the_arguments(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "order 1")
        replay = system.replay(
            source, model="replaytest:off_by_one", tools=ReplayTools(match="name")
        )
        system.run_until_idle()
        assert _after_fork(system, replay)[-1] == AssistantTurn(text="answer: order 1 shipped")


def test_a_redelivered_replay_slice_adds_nothing_twice(open_store: StoreOpener) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "order 1", "order 2")
        replay = system.replay(source, model="replaytest:same")
        system.run_until_idle()
        before = system.stored_history(replay, full=True)

        system.wake(replay, Priority.BACKGROUND)  # a slice delivered again
        system.run_until_idle()
        for seq in (1, 5):  # the fed inputs, queued again by a slice run twice
            with pytest.raises(DuplicateMessage):
                system.store.enqueue(replay, f"replay:{seq}", UserMessage(text="x"), 4)
        assert system.stored_history(replay, full=True) == before


def test_a_replay_must_start_at_recorded_user_text(open_store: StoreOpener) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "order 1")
        with pytest.raises(InvalidForkPoint, match="seq 2: a replay starts at recorded user text"):
            system.replay(source, from_seq=2)


def test_the_diff_of_a_replay_with_the_same_model_is_empty(open_store: StoreOpener) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "order 1", "job build", "order 2")
        replay = system.replay(source, model="replaytest:same")
        system.run_until_idle()
        found = system.diff(source, replay, scorer=lambda a, b: a == b)

    assert found.same and found.first_divergence is None and found.tool_distance == 0
    assert (found.served, found.missed, found.live) == (3, 0, 0)
    assert found.source_answer == found.replay_answer == "answer: order 2 shipped"
    assert found.verdict is True
    assert found.deltas["completions"] == 0 and found.deltas["tokens"] == 0


def test_the_diff_of_a_changed_model_diverges_at_its_first_different_call(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "hello 1", "order 1", "order 2")
        replay = system.replay(source, model="replaytest:refunds")
        system.run_until_idle()
        found = system.diff(source, replay)
        call_seq = system.stored_history(source)[3].seq

    first = found.first_divergence
    assert first is not None and not found.same
    assert (first.step, first.source_seq, first.replay_seq) == (4, call_seq, call_seq)
    assert first.source == 'call lookup({"order":1})'
    assert first.replay == 'call refund({"order":1})'
    assert found.tool_distance == 2  # two lookups became two refunds
    assert (found.served, found.missed, found.live) == (0, 2, 0)
    assert found.replay_answer.startswith("answer: " + MISS_PREFIX)


def test_dormant_diff_prints_the_first_divergence_and_json(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/d.db"
    with LocalSystem([AGENT], url, settings=_settings()) as system:
        source = _recorded(system, "order 1")
        replay = system.replay(source, model="replaytest:refunds")
        system.run_until_idle()
    runner = CliRunner()
    shown = runner.invoke(app, ["diff", source, replay, "--database-url", url])
    as_json = runner.invoke(app, ["diff", source, replay, "--database-url", url, "--json"])
    assert shown.exit_code == 0 and as_json.exit_code == 0, (shown.output, as_json.output)
    assert 'replay: call refund({"order":1})' in shown.output
    assert "missed 1" in shown.output
    assert json.loads(as_json.output)["first_divergence"]["step"] == 2


def test_usage_of_replays_is_kept_apart_under_their_tag(open_store: StoreOpener) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _recorded(system, "order 1")
        production = system.store.usage()["support"]
        system.replay(source, model="replaytest:same", tag="exp42")
        system.run_until_idle()
        usage = system.store.usage()
        only_support = system.store.usage(agent="support")

    assert usage["support"] == production  # the replay added nothing to production's
    assert usage["support [replay:exp42]"].completions == 2
    assert set(only_support) == {"support", "support [replay:exp42]"}


def test_dormant_usage_shows_replays_under_their_tag(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/u.db"
    with LocalSystem([AGENT], url, settings=_settings()) as system:
        source = _recorded(system, "order 1")
        system.replay(source, model="replaytest:same", tag="exp42")
        system.run_until_idle()
    shown = CliRunner().invoke(app, ["usage", "--database-url", url, "--json"])
    assert shown.exit_code == 0, shown.output
    assert set(json.loads(shown.output)) == {"support", "support [replay:exp42]"}
    table = CliRunner().invoke(app, ["usage", "--database-url", url])
    assert table.exit_code == 0, table.output
    assert "support [replay:exp42]" in table.output  # a name, not Rich markup to strip


def test_a_batch_replays_a_sample_of_recorded_roots_and_reports_their_diffs(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        since = datetime.now(UTC)
        sources = [_recorded(system, f"order {n}") for n in range(4)]
        system.fork(sources[0], at_seq=1)  # a fork is never a source
        system.replay(sources[1], model="replaytest:same")  # nor is a replay
        system.run_until_idle()
        picked = pick_sources(system.store, "support", since, 3, seed=1)
        assert len(picked) == 3 and {p.id for p in picked} < set(sources)
        assert pick_sources(system.store, "support", since, 10) == sorted(
            [system.thread(s) for s in sources], key=lambda i: (i.created_at, i.id)
        )
        report = replay_batch(
            system, picked, tag="exp7", model="replaytest:refunds", timeout_s=10, poll_s=0.01
        )

    totals = report["totals"]
    assert (totals["replays"], totals["same"], totals["diverged"]) == (3, 0, 3)
    assert (totals["unfinished"], totals["served"], totals["missed"]) == (0, 0, 3)
    assert [r["source_id"] for r in report["runs"]] == [p.id for p in picked]
    assert all(r["first_divergence"]["step"] == 2 for r in report["runs"])
    json.dumps(report)  # one JSON report


def test_the_evaluation_page_example_prints_what_it_says() -> None:
    doc = Path(__file__).resolve().parent.parent / "docs" / "evaluation.md"
    text_ = doc.read_text()
    snippet = re.findall(r"```python\n(.*?)```", text_, re.DOTALL)[0]
    printed = re.search(r"\nprints\n\n```\n(.*?)```", text_, re.DOTALL)
    assert printed is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, str(doc), "exec"), {})
    assert out.getvalue() == printed[1]


class _Query(BaseModel):
    q: str


def test_a_replay_sends_no_http_mcp_or_subscription_call_and_writes_no_outbox_row(
    open_store: StoreOpener,
) -> None:
    """A source that called an HTTP tool, an MCP tool and a webhook subscription: its
    replay is served all three from the record; no request leaves, no outbox row exists."""
    requests: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={"result": "live"})

    crm = http_tool(
        "crm",
        "http://crm.invalid/call",
        description="The CRM.",
        arguments=_Query,
        deferred=False,
        transport=httpx.MockTransport(answer),
    )
    docs = McpTool(
        name="docs_search",
        description="Search the docs.",
        arguments=_Query,
        server=McpServer(stdio=("/nonexistent/mcp-server",)),
        remote_name="search",
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
    )

    @tool(subscription=True)
    def watch_tickets(q: str) -> str:
        """Webhook subscription to new tickets."""
        raise AssertionError("a replay subscribed again")

    made = (
        call("crm", "c1", q="a"),
        call("docs_search", "c2", q="b"),
        call("watch_tickets", "c3", q="c"),
    )

    def script(items: Sequence[Item]) -> Completion:
        if isinstance(items[-1], UserText):
            return reply("", *(call(c.name, **c.args) for c in made))
        return reply("all done")

    register_provider("recorded", lambda name: ScriptedModel(script))
    agent = Agent("ops", model=ScriptedModel(script), tools=[crm, docs, watch_tickets])
    recorded = [
        StoredItem(1, "launch:src", UserText(text="check everything")),
        StoredItem(2, "turn:2", AssistantTurn(calls=made)),
        StoredItem(3, "result:c1", ToolResult(call_id="c1", name="crm", content="crm: ok")),
        StoredItem(
            4, "result:c2", ToolResult(call_id="c2", name="docs_search", content="docs: ok")
        ),
        StoredItem(
            5, "result:c3", ToolResult(call_id="c3", name="watch_tickets", content="watching")
        ),
        StoredItem(6, "turn:6", AssistantTurn(text="all done")),
    ]
    store = open_store()
    store.create_thread(NewThread(id="thr_src", agent="ops", items=recorded))
    with LocalSystem([agent], settings=_settings(), store=store) as system:
        replay = system.replay("thr_src", model="recorded:same")
        system.run_until_idle()
        found = system.diff("thr_src", replay)

    assert found.same and (found.served, found.missed, found.live) == (3, 0, 0)
    assert requests == []
    assert _outbox_rows(store, replay) in (None, 0)


def _crafted(store: Store, thread_id: str, agent: str, items: list[Item]) -> None:
    """A recorded source written as it was stored (no model or tool runs for it)."""
    stored = [StoredItem(seq, f"m{seq}", item) for seq, item in enumerate(items, 1)]
    store.create_thread(NewThread(id=thread_id, agent=agent, items=stored))


@tool(subscription=True)
def watch_prs(repo: str) -> str:
    """Subscribe to pull requests."""
    raise AssertionError("a replay subscribed again")


def _watcher(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText) and last.text == "nap":
        return reply("", call("sleep", seconds=3600))
    if isinstance(last, UserText):
        return reply("", call("watch_prs", repo=last.text))
    if isinstance(last, EventShown):
        return reply(f"noted: {last.content}")
    assert isinstance(last, ToolResult)
    return reply(f"ok: {last.content}")


def test_a_replay_feeds_recorded_events_to_the_subscription_it_was_served(
    open_store: StoreOpener,
) -> None:
    register_provider("watcher", lambda name: ScriptedModel(_watcher))
    agent = Agent("watcher", model=ScriptedModel(_watcher), tools=[watch_prs])
    sub = ToolCall(call_id="c1", name="watch_prs", args={"repo": "acme"})
    store = open_store()
    _crafted(
        store,
        "thr_watch",
        "watcher",
        [
            UserText(text="acme"),
            AssistantTurn(calls=(sub,)),
            ToolResult(call_id="c1", name="watch_prs", content="watching acme"),
            AssistantTurn(text="ok: watching acme"),
            EventShown(
                call_id="e1",
                original_call_id="c1",
                original_name="watch_prs",
                original_args={"repo": "acme"},
                content="PR 7 opened",
            ),
            AssistantTurn(text="noted: PR 7 opened"),
        ],
    )
    with LocalSystem([agent], settings=_settings(), store=store) as system:
        replay = system.replay("thr_watch", model="watcher:same")
        system.run_until_idle()
        found = system.diff("thr_watch", replay)
        shown = [i for i in system.history(replay) if isinstance(i, EventShown)]

    assert found.same, found.first_divergence
    assert [(e.original_name, e.content) for e in shown] == [("watch_prs", "PR 7 opened")]


def test_a_replay_serves_a_recorded_sleep_without_waiting_for_a_timer(
    open_store: StoreOpener,
) -> None:
    register_provider("watcher", lambda name: ScriptedModel(_watcher))
    agent = Agent("watcher", model=ScriptedModel(_watcher), tools=[watch_prs])
    nap = ToolCall(call_id="s1", name="sleep", args={"seconds": 3600})
    store = open_store()
    _crafted(
        store,
        "thr_nap",
        "watcher",
        [
            UserText(text="nap"),
            AssistantTurn(calls=(nap,)),
            ToolResult(call_id="s1", name="sleep", content="Woke up after 3600 s."),
            AssistantTurn(text="ok: Woke up after 3600 s."),
        ],
    )
    with LocalSystem([agent], settings=_settings(), store=store) as system:
        replay = system.replay("thr_nap", model="watcher:same")
        system.run_until_idle()
        found = system.diff("thr_nap", replay)
        status = system.thread(replay).status

    assert status is ThreadStatus.IDLE  # not waiting an hour on a timer of its own
    assert found.same, found.first_divergence


def test_a_thread_launched_with_replay_metadata_is_no_replay(open_store: StoreOpener) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        thread_id = system.launch("support", "order 1", metadata={"replay": "mine"})
        system.run_until_idle()
        assert system.history(thread_id)[-1] == AssistantTurn(text="answer: order 1 shipped")
        assert ran["lookup"] == 1


@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
def test_a_replay_slice_that_dies_and_is_delivered_again_adds_nothing_twice(
    open_store: StoreOpener, point: str
) -> None:
    harness = Harness(AGENT, store=open_store())
    source = harness.launch("support", "order 1")
    harness.drain()
    harness.send(source, "order 2")
    harness.drain()
    replay = harness.replay(source, model="replaytest:same")
    harness.crash_at(point, lambda: harness.step(replay))  # the first input's slice dies
    harness.step(replay)  # delivered again
    harness.drain()

    assert _shape(_after_fork(harness, replay)) == _shape(harness.history(source, full=True))
    fed = [s.message_id for s in harness.stored_history(replay) if isinstance(s.item, UserText)]
    assert fed == ["replay:1", "replay:5"]
    assert ran["lookup"] == 2


def _delegating(items: Sequence[Item], offset: int = 0) -> Completion:
    """A parent that hands ``delegate N`` to a child; the child looks order N up and
    closes with a final report; the parent answers the report."""
    seed = next(
        (i for i in items if isinstance(i, ToolResult) and i.content.startswith("You are now")),
        None,
    )
    last = items[-1]
    if seed is not None:  # the child
        if last is seed:
            task = re.search(r"look up (\d+)", seed.content)
            assert task is not None
            return reply("", call("lookup", order=int(task[1])))
        assert isinstance(last, ToolResult)
        return reply("", call("close_thread", report=f"found: {last.content}"))
    if isinstance(last, UserText) and last.text.startswith("delegate"):
        n = int(last.text.split()[-1]) + offset
        return reply("", call("spawn_thread", instructions=f"look up {n}"))
    if isinstance(last, UserText) and last.text == "job slow":
        return reply("starting", call("slow_job", name="slow"))
    if isinstance(last, UserText):
        return reply(f"you said {last.text}")
    if isinstance(last, EventShown):
        return reply(f"heard: {last.content}")
    assert isinstance(last, ToolResult)
    return reply(f"answer: {last.content}")


@tool(deferred=True)
def slow_job(name: str, ctx: ToolContext) -> None:
    """Start a slow job; its result is delivered much later."""
    ran["start_job"] += 1


register_provider(
    "delegating",
    lambda name: ScriptedModel(lambda items: _delegating(items, offset=int(name == "other"))),
)
DELEGATING = Agent(
    "delegator", model=ScriptedModel(_delegating), tools=[lookup, slow_job], threads=True
)


def test_a_replay_feeds_a_recorded_child_report_and_spawns_no_child(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([DELEGATING], settings=_settings(), store=open_store()) as system:
        source = system.launch("delegator", "delegate 7")
        system.run_until_idle()
        (child,) = system.store.children(source)
        assert ran["lookup"] == 1 and child.status is ThreadStatus.CLOSED
        threads = len(system.store.threads(limit=100))

        replay = system.replay(source, model="delegating:same", tag="kids")
        system.run_until_idle()
        found = system.diff(source, replay)
        replayed = _after_fork(system, replay)

        assert found.same, found.first_divergence
        assert (found.served, found.missed, found.live) == (1, 0, 0)
        assert _shape(replayed) == _shape(system.history(source, full=True))
        report = [i for i in replayed if isinstance(i, EventShown)]
        assert [(e.original_name, e.content) for e in report] == [
            (
                "spawn_thread",
                f"Child thread {child.id} closed. Final report: found: order 7 shipped",
            )
        ]
        assert system.store.children(replay) == []  # no child: nothing ran live
        assert len(system.store.threads(limit=100)) == threads + 1
        assert ran["lookup"] == 1
        assert _outbox_rows(system.store, replay) in (None, 0)
        assert system.thread(replay).status is ThreadStatus.IDLE


def test_a_replay_never_spawns_a_child_the_record_does_not_have(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([DELEGATING], settings=_settings(), store=open_store()) as system:
        source = system.launch("delegator", "delegate 7")
        system.run_until_idle()
        replays = [
            system.replay(source, model="delegating:other", tools=ReplayTools(on_miss=on_miss))
            for on_miss in ("error", "live")
        ]
        system.run_until_idle()

        for replay in replays:
            result = _after_fork(system, replay)[2]
            assert isinstance(result, ToolResult) and result.is_error
            assert result.content.startswith(
                MISS_PREFIX + 'spawn_thread({"instructions":"look up 8"}) #1'
            )
            assert system.store.children(replay) == []
            assert system.diff(source, replay).missed == 1
        assert "not declared side_effect_free" in str(_after_fork(system, replays[1])[2])
        assert ran["lookup"] == 1  # the source's child only


def test_a_replay_holds_an_interrupted_call_and_feeds_its_late_result(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([DELEGATING], settings=_settings(), store=open_store()) as system:
        source = system.launch("delegator", "job slow")
        system.run_until_idle()
        (job,) = [c for c in system.store.load(source).calls.values() if c.name == "slow_job"]
        system.send(source, "hurry up")  # interrupts the job's call
        system.run_until_idle()
        system.deliver(source, job.call_id, "slow done")  # a late result: an event
        system.run_until_idle()
        late = [i for i in system.history(source) if isinstance(i, EventShown)]
        assert [e.content for e in late] == ["late result: slow done"]
        assert ran["start_job"] == 1

        replay = system.replay(source, model="delegating:same")
        system.run_until_idle()
        found = system.diff(source, replay)

        assert found.same, found.first_divergence
        assert _shape(_after_fork(system, replay)) == _shape(system.history(source, full=True))
        assert ran["start_job"] == 1  # the job never started again
        assert _outbox_rows(system.store, replay) in (None, 0)
        assert system.thread(replay).status is ThreadStatus.IDLE


def test_a_replay_holds_a_sleep_an_event_woke_and_feeds_that_event(
    open_store: StoreOpener,
) -> None:
    register_provider("watcher", lambda name: ScriptedModel(_watcher))
    agent = Agent("watcher", model=ScriptedModel(_watcher), tools=[watch_prs])
    sub = ToolCall(call_id="c1", name="watch_prs", args={"repo": "acme"})
    nap = ToolCall(call_id="s1", name="sleep", args={"seconds": 3600})
    event = EventShown(
        call_id="e1",
        original_call_id="c1",
        original_name="watch_prs",
        original_args={"repo": "acme"},
        content="PR 7 opened",
    )
    items: list[tuple[str, Item]] = [
        ("m1", UserText(text="acme")),
        ("m2", AssistantTurn(calls=(sub,))),
        ("m3", ToolResult(call_id="c1", name="watch_prs", content="watching acme")),
        ("m4", AssistantTurn(text="ok: watching acme")),
        ("m5", UserText(text="nap")),
        ("m6", AssistantTurn(calls=(nap,))),
        ("s1:woken", ToolResult(call_id="s1", name="sleep", content=WOKEN_BY_EVENT)),
        ("m8", event),
        ("m9", AssistantTurn(text="noted: PR 7 opened")),
    ]
    store = open_store()
    stored = [StoredItem(seq, mid, item) for seq, (mid, item) in enumerate(items, 1)]
    store.create_thread(NewThread(id="thr_woken", agent="watcher", items=stored))
    with LocalSystem([agent], settings=_settings(), store=store) as system:
        replay = system.replay("thr_woken", model="watcher:same")
        system.run_until_idle()
        found = system.diff("thr_woken", replay)
        status = system.thread(replay).status

    assert found.same, found.first_divergence
    assert status is ThreadStatus.IDLE


def test_threads_of_a_tag_are_found_by_it_whatever_their_age_paged(
    open_store: StoreOpener,
) -> None:
    store = open_store()
    for n in range(5):
        store.create_thread(NewThread(id=f"thr_t{n}", agent="a", tag="replay:exp"))
        store.create_thread(NewThread(id=f"thr_p{n}", agent="a"))
    first = store.threads(limit=3, tag="replay:exp")
    rest = store.threads(limit=3, tag="replay:exp", before=(first[-1].created_at, first[-1].id))
    assert [i.id for i in first + rest] == [f"thr_t{n}" for n in (4, 3, 2, 1, 0)]
    assert store.threads(tag="replay:other") == []


class _CountingStore(MemoryStore):
    """Counts the reads of all of one thread's own items (a replay's history reads them
    up to its fork point only)."""

    watched = ""
    reads = 0

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
        if thread_id == self.watched and upto_seq is None:
            self.reads += 1
        return super().own_items(thread_id, upto_seq)


def test_a_replay_reads_its_source_transcript_once_not_once_a_slice() -> None:
    store = _CountingStore()
    with LocalSystem([AGENT], settings=_settings(), store=store) as system:
        source = _recorded(system, "hello 1", "hello 2", "hello 3", "order 4")
        store.watched = source
        replay = system.replay(source, model="replaytest:same")
        system.run_until_idle()
        reads = store.reads
        assert system.diff(source, replay).same

    assert len([i for i in system.history(replay) if isinstance(i, UserText)]) == 4
    assert reads == 1  # four slices at least, one read of the source


def test_a_replay_feeds_inputs_the_source_read_together_in_one_turn(
    open_store: StoreOpener,
) -> None:
    """A child's report and its closing report reached the source's model together (one
    turn for both): the replay's model reads them together too."""
    spawn = ToolCall(call_id="c1", name="spawn_thread", args={"instructions": "look up 7"})

    def report(content: str) -> EventShown:
        return EventShown(
            call_id=f"e{len(content)}",
            original_call_id="c1",
            original_name="spawn_thread",
            original_args=spawn.args,
            content=content,
        )

    started = "Child thread thr_kid started. Its reports will reach you as events on this call."
    closed = "Child thread thr_kid closed. Final report: found: order 7 shipped"
    store = open_store()
    _crafted(
        store,
        "thr_together",
        "delegator",
        [
            UserText(text="delegate 7"),
            AssistantTurn(calls=(spawn,)),
            ToolResult(call_id="c1", name="spawn_thread", content=started),
            AssistantTurn(text=f"answer: {started}"),
            report("Report from child thread thr_kid: halfway"),
            report(closed),
            AssistantTurn(text=f"heard: {closed}"),
        ],
    )
    with LocalSystem([DELEGATING], settings=_settings(), store=store) as system:
        replay = system.replay("thr_together", model="delegating:same")
        system.run_until_idle()
        found = system.diff("thr_together", replay)
        children = system.store.children(replay)

    assert found.same, found.first_divergence
    assert children == [] and ran["lookup"] == 0
