"""The whole transcript stays reachable after compaction: ``history(full=True)`` and
``dormant show --full``, while ``history()`` stays what the model sees."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from dormant import Agent, LocalSystem
from dormant.cli import app
from dormant.messages import AssistantTurn, Summary, Usage, UserText
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.stores.base import Commit, NewThread, StoredItem, ThreadStatus


@dataclass
class Verbose:
    """Uses 90% of its context window on every answer, so each slice compacts the next."""

    name: str = "verbose"
    context_window: int = 1000

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        if not request.tools:  # a summary request
            return Completion(text="the user said hello", usage=Usage(input_tokens=100))
        last = request.items[-1]
        said = last.text if isinstance(last, UserText) else "?"
        return Completion(text=f"you said {said}", usage=Usage(input_tokens=900))


AGENT = Agent("a", model=Verbose(), compact_at=0.75)


def test_full_history_keeps_what_a_summary_replaced_and_history_stays_what_the_model_sees(
    tmp_path: Path,
) -> None:
    with LocalSystem([AGENT], f"sqlite:///{tmp_path}/t.db") as system:
        thread_id = system.launch("a", "hello")
        system.run_until_idle()
        system.send(thread_id, "more")
        system.run_until_idle()
        seen = system.history(thread_id)
        full = system.history(thread_id, full=True)
        stored = system.stored_history(thread_id, full=True)

    assert isinstance(seen[0], Summary) and UserText(text="hello") not in seen
    assert full[:2] == [UserText(text="hello"), AssistantTurn(text="you said hello")]
    assert [type(i).__name__ for i in full] == [
        "UserText",
        "AssistantTurn",
        "UserText",
        "Summary",
        "AssistantTurn",
    ]
    assert all(item in full for item in seen)
    assert [s.seq for s in stored] == sorted(s.seq for s in stored)


def test_show_full_prints_the_whole_transcript_and_show_prints_what_the_model_sees(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    with LocalSystem([AGENT], url) as system:
        thread_id = system.launch("a", "hello")
        system.run_until_idle()
        system.send(thread_id, "more")
        system.run_until_idle()
    runner = CliRunner()
    seen = runner.invoke(app, ["show", thread_id, "--database-url", url])
    full = runner.invoke(app, ["show", thread_id, "--full", "--database-url", url])
    assert seen.exit_code == 0 and full.exit_code == 0, (seen.output, full.output)
    assert "you said hello" not in seen.output and "summary" in seen.output
    assert "you said hello" in full.output and "summary" in full.output


def test_a_child_thread_full_history_includes_what_it_inherited() -> None:
    with LocalSystem([AGENT], "memory://") as system:
        store = system.store
        store.create_thread(NewThread(id="p", agent="a"))
        parent = [StoredItem(i, f"m{i}", UserText(text=f"u{i}")) for i in range(1, 5)]
        version = store.thread("p").version
        store.commit(Commit("p", version, ThreadStatus.IDLE, 0, items=parent))
        store.create_thread(NewThread(id="c", agent="a", parent_id="p", fork_seq=2))
        own = [
            StoredItem(3, "c3", UserText(text="child")),
            StoredItem(4, "s", Summary(text="s", upto_seq=3)),
        ]
        store.commit(Commit("c", store.thread("c").version, ThreadStatus.IDLE, 0, items=own))
        assert system.history("c") == [Summary(text="s", upto_seq=3)]
        assert system.history("c", full=True) == [
            UserText(text="u1"),
            UserText(text="u2"),
            UserText(text="child"),
            Summary(text="s", upto_seq=3),
        ]
