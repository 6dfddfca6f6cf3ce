"""Forks (``client.fork``, ``runtime/forks.py``) on every store: one thread row that reads
the source's history up to a seq by reference, then an ordinary thread of its own."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from dormant import Agent, LocalSystem, Settings, ToolContext, tool
from dormant.cli import app
from dormant.errors import InvalidForkPoint, UnknownThread
from dormant.http.ui.dashboard import Dashboard, UIRequest
from dormant.messages import AssistantTurn, Item, Summary, ToolResult, Usage, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.ops.check import check_store
from dormant.runtime.forks import fork_thread
from dormant.stores.base import CallState, NewThread, Store, StoredItem, ThreadInfo, ThreadStatus
from tests.conftest import StoreOpener

built: list[str] = []


@tool(deferred=True)
def run_build(target: str, ctx: ToolContext) -> None:
    """Start a build; the result arrives later."""
    built.append(target)


def _script(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText) and last.text.startswith("build"):
        return reply("building", call("run_build", target=last.text.split()[-1]))
    if isinstance(last, UserText):
        return reply(f"you said {last.text}")
    assert isinstance(last, ToolResult)
    return reply(f"result: {last.content}")


AGENT = Agent("a", model=ScriptedModel(_script), tools=[run_build])


def _settings() -> Settings:
    return Settings(model_backoff_s=0.0, sweep_interval_s=0.05)


def _chat(system: LocalSystem, *texts: str) -> str:
    thread_id = system.launch("a", texts[0])
    system.run_until_idle()
    for text in texts[1:]:
        system.send(thread_id, text)
        system.run_until_idle()
    return thread_id


def test_a_fork_writes_one_thread_row_and_reads_the_source_history_up_to_its_seq(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _chat(system, "one", "two", "three")
        before = len(system.threads(limit=1000))
        fork_id = system.fork(source, at_seq=2, metadata={"why": "try"})

        assert len(system.threads(limit=1000)) == before + 1
        assert system.store.own_items(fork_id) == []  # nothing copied
        assert system.history(fork_id) == system.history(source)[:2]
        info = system.thread(fork_id)
        assert (info.source_id, info.fork_seq, info.parent_id, info.root_id) == (
            source,
            2,
            None,
            fork_id,
        )
        assert info.status is ThreadStatus.IDLE
        assert info.metadata["why"] == "try"
        assert info.metadata["fork"] == {
            "source": source,
            "at_seq": 2,
            "code_version": system.thread(source).code_version,
            "open_calls": "cancel",
        }
        assert info.metadata["fork"]["code_version"]  # the source agent's version


def test_a_fork_is_an_ordinary_thread_afterwards_and_leaves_its_source_alone(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _chat(system, "one", "two")
        kept = system.history(source)
        fork_id = system.fork(source, at_seq=2)
        system.send(fork_id, "other")
        system.run_until_idle()

        assert system.history(fork_id) == [
            *kept[:2],
            UserText(text="other"),
            AssistantTurn(text="you said other"),
        ]
        assert [s.seq for s in system.stored_history(fork_id)] == [1, 2, 3, 4]
        assert system.history(source) == kept
        system.close_thread(source)
        assert system.thread(fork_id).status is ThreadStatus.IDLE  # a root of its own
        assert check_store(system.store) == []


def test_a_fork_cancels_the_calls_open_at_its_seq_with_an_error_result(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _chat(system, "build main")
        assert system.thread(source).status is ThreadStatus.WAITING
        turn = system.stored_history(source)[-1]
        assert isinstance(turn.item, AssistantTurn)
        fork_id = system.fork(source, at_seq=turn.seq)

        result = system.history(fork_id)[-1]
        assert isinstance(result, ToolResult) and result.is_error
        assert "forked from thread" in result.content
        assert system.thread(fork_id).status is ThreadStatus.IDLE
        call_id = turn.item.calls[0].call_id
        assert system.store.call(fork_id, call_id).state is CallState.ANSWERED
        system.send(fork_id, "hello")
        system.run_until_idle()
        assert system.history(fork_id)[-1] == AssistantTurn(text="you said hello")
        assert check_store(system.store) == []


def test_a_fork_can_keep_the_calls_open_at_its_seq_pending_for_a_deliver(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _chat(system, "build main")
        turn = system.stored_history(source)[-1]
        assert isinstance(turn.item, AssistantTurn)
        call_id = turn.item.calls[0].call_id
        fork_id = system.fork(source, at_seq=turn.seq, open_calls="keep")

        assert system.thread(fork_id).status is ThreadStatus.WAITING
        assert system.store.call(fork_id, call_id).state is CallState.PENDING
        system.deliver(fork_id, call_id, "green")
        system.run_until_idle()
        assert system.history(fork_id)[-1] == AssistantTurn(text="result: green")
        assert system.thread(source).status is ThreadStatus.WAITING  # still its own call


def test_a_fork_of_a_fork_reads_the_right_history_above_and_below_the_first_fork(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _chat(system, "one", "two")
        first = system.fork(source, at_seq=2)
        system.send(first, "other")
        system.run_until_idle()
        above = system.fork(first, at_seq=3)
        below = system.fork(first, at_seq=1)

        assert system.history(above) == system.history(first)[:3]
        assert system.history(below) == [UserText(text="one")]
        system.send(below, "again")
        system.run_until_idle()
        assert system.history(below)[-1] == AssistantTurn(text="you said again")
        assert [s.seq for s in system.stored_history(below)] == [1, 2, 3]
        assert [s.seq for s in system.stored_history(below, full=True)] == [1, 2, 3]


class _Verbose:
    """Uses 90% of its context window on every answer, so each slice compacts the next."""

    name = "verbose"
    context_window = 1000

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        if not request.tools:
            return Completion(text="summary of the start", usage=Usage(input_tokens=100))
        last = request.items[-1]
        said = last.text if isinstance(last, UserText) else "?"
        return Completion(text=f"you said {said}", usage=Usage(input_tokens=900))


def test_a_fork_after_a_compaction_sees_the_summary_only_past_it(
    open_store: StoreOpener,
) -> None:
    verbose = Agent("v", model=_Verbose(), compact_at=0.75)
    with LocalSystem([verbose], settings=_settings(), store=open_store()) as system:
        source = system.launch("v", "hello")
        system.run_until_idle()
        system.send(source, "more")
        system.run_until_idle()
        stored = system.stored_history(source, full=True)
        summary_seq = next(s.seq for s in stored if isinstance(s.item, Summary))
        last = stored[-1].seq

        late = system.fork(source, at_seq=last)
        early = system.fork(source, at_seq=summary_seq - 1)

        assert system.history(late) == system.history(source)
        assert isinstance(system.history(late)[0], Summary)
        assert system.history(early) == [s.item for s in stored if s.seq < summary_seq]


def test_a_fork_at_a_seq_the_history_does_not_reach_is_refused(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _chat(system, "one")
        before = len(system.threads(limit=1000))
        for at_seq in (-1, 3, 10_000):
            with pytest.raises(InvalidForkPoint, match="runs from 1 to 2"):
                system.fork(source, at_seq=at_seq)
        assert len(system.threads(limit=1000)) == before


def test_dormant_fork_prints_the_new_thread_id(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/f.db"
    with LocalSystem([AGENT], url, settings=_settings()) as system:
        source = _chat(system, "one", "two")
    runner = CliRunner()
    done = runner.invoke(app, ["fork", source, "--at-seq", "2", "--database-url", url])
    assert done.exit_code == 0, done.output
    fork_id = done.output.strip()
    with LocalSystem([AGENT], url, settings=_settings()) as system:
        assert system.thread(fork_id).source_id == source
        assert system.history(fork_id) == system.history(source)[:2]


def test_retention_keeps_a_source_while_a_fork_of_it_lives(open_store: StoreOpener) -> None:
    later = datetime.now(UTC) + timedelta(days=1)
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _chat(system, "one", "two")
        fork_id = system.fork(source, at_seq=2)
        system.close_thread(source)

        assert system.store.prune_batch(later, 100).threads == 0
        assert system.history(fork_id) == system.history(source)[:2]
        system.close_thread(fork_id)
        pruned = system.store.prune_batch(later, 100).threads
        pruned += system.store.prune_batch(later, 100).threads  # the source after its fork
        assert pruned == 2
        with pytest.raises(UnknownThread):
            system.thread(source)


class _Counting:
    """A store that counts the items a fork reads."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.read = 0

    def thread(self, thread_id: str) -> ThreadInfo:
        return self.store.thread(thread_id)

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
        found = self.store.own_items(thread_id, upto_seq)
        self.read += len(found)
        return found

    def own_items_between(self, thread_id: str, after_seq: int, upto_seq: int) -> list[StoredItem]:
        found = self.store.own_items_between(thread_id, after_seq, upto_seq)
        self.read += len(found)
        return found

    def create_thread(self, thread: NewThread) -> ThreadInfo:
        return self.store.create_thread(thread)


@pytest.mark.parametrize("size", [10, 10_000])
def test_a_fork_reads_and_writes_as_much_for_ten_thousand_source_items_as_for_ten(
    store: Store, size: int
) -> None:
    items = [
        StoredItem(s, f"m{s}", UserText(text=f"q{s}") if s % 2 else AssistantTurn(text=f"a{s}"))
        for s in range(1, size + 1)
    ]
    store.create_thread(NewThread(id="thr_big", agent="a", items=items))
    counting = _Counting(store)
    made = fork_thread(counting, "thr_big", size)

    assert counting.read <= 32  # one window back from the fork point, whatever the size
    assert store.own_items(made.id) == []
    assert [s.seq for s in store.history(made.id)][-3:] == [size - 2, size - 1, size]


def test_a_fork_streams_budgets_and_shows_on_the_dashboard_like_any_root(
    open_store: StoreOpener,
) -> None:
    with LocalSystem([AGENT], settings=_settings(), store=open_store()) as system:
        source = _chat(system, "one", "two")
        fork_id = system.fork(source, at_seq=2)
        system.raise_budget(fork_id, max_tokens=10_000)
        system.send(fork_id, "other")
        system.run_until_idle()
        system.close_thread(fork_id, reason="tried")
        events = list(system.stream(fork_id, timeout_s=5))
        page = Dashboard(system).handle(UIRequest("GET", "thread", "/ui/", query={"id": fork_id}))
        spent = system.thread(fork_id).tree_tokens

    # A stream carries what the thread itself adds, as a child's does: its own items.
    assert [e.type for e in events] == ["item", "item", "status"]
    assert page.status == 200 and "you said other" in page.body.decode()
    assert spent > 0  # the fork's own tree: its source's spend is not counted


def test_dormant_threads_and_the_dashboard_list_say_what_a_fork_came_from(
    tmp_path: object,
) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    with LocalSystem([AGENT], url, settings=_settings()) as system:
        source = _chat(system, "one")
        fork_id = system.fork(source, at_seq=1)
        listing = Dashboard(system).handle(UIRequest("GET", "", "/ui/")).body.decode()
    shown = CliRunner().invoke(app, ["threads", "--database-url", url])
    as_json = CliRunner().invoke(app, ["threads", "--database-url", url, "--json"])
    assert shown.exit_code == 0 and as_json.exit_code == 0, shown.output
    assert f"[fork of {source} at 1]" in shown.output
    record = next(r for r in json.loads(as_json.output) if r["id"] == fork_id)
    assert (record["source_id"], record["fork_seq"], record["tag"]) == (source, 1, None)
    assert f'fork of <a class="mono" href="/ui/thread?id={source}">' in listing
