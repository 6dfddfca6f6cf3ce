"""SQLite under contention: many pool threads writing one file wait for each other; a busy
database never fails a slice (issue 11: "database is locked" under load)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from dormant import Agent, LocalSystem, tool
from dormant.messages import AssistantTurn, Item, ToolResult, UserMessage, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.stores.base import NewThread, Priority, ThreadStatus
from dormant.stores.sql import engine as sql_engine
from dormant.stores.sql.store import SQLStore, upgrade

AGENTS = 150
POOL_WORKERS = 16
GIL_HOGS = 2
"""Pure-Python busy loops in this process: like a loaded machine, they make a thread that
holds SQLite's write lock wait for the interpreter between its statements."""


@tool
def double(n: int) -> int:
    """Twice ``n``."""
    return 2 * n


def _script(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, ToolResult):
        return reply(f"twice is {last.content}")
    assert isinstance(last, UserText)
    return reply("doubling", call("double", n=int(last.text)))


@contextmanager
def _gil_hogs(count: int) -> Iterator[None]:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    hogs = [threading.Thread(target=spin, name=f"hog-{n}") for n in range(count)]
    for hog in hogs:
        hog.start()
    try:
        yield
    finally:
        stop.set()
        for hog in hogs:
            hog.join()


@pytest.mark.timeout(900)  # minutes on a loaded machine; the point is that it never fails
def test_a_hundred_and_fifty_agents_on_sixteen_pool_threads_share_one_sqlite_file(
    tmp_path: Path,
) -> None:
    agent = Agent("doubler", model=ScriptedModel(_script), tools=[double])
    url = f"sqlite:///{tmp_path}/contended.db"
    with LocalSystem([agent], url, workers=POOL_WORKERS) as system, _gil_hogs(GIL_HOGS):
        # Launching from here while the pool already runs the first slices: the test's
        # thread, sixteen slice and tool threads and the sweeper all write the one file.
        ids = [system.launch("doubler", str(n)) for n in range(AGENTS)]
        system.run_until_idle(timeout_s=600)  # a failed slice or tool would raise here
        for n, thread_id in enumerate(ids):
            history = system.history(thread_id)
            assert [i.kind for i in history] == ["user", "assistant", "tool_result", "assistant"]
            last = history[-1]
            assert isinstance(last, AssistantTurn) and last.text == f"twice is {2 * n}"
            assert system.thread(thread_id).status is ThreadStatus.IDLE


def test_a_write_blocked_past_the_busy_timeout_by_another_process_is_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process (a CLI, a second ``LocalSystem``) holds SQLite's write lock for
    longer than the busy timeout: the transaction is rolled back, retried, and succeeds."""
    monkeypatch.setattr(sql_engine, "SQLITE_BUSY_TIMEOUT_MS", 50)
    url = f"sqlite:///{tmp_path}/shared.db"
    upgrade(url)
    store = SQLStore(url)
    other = sqlite3.connect(tmp_path / "shared.db", isolation_level=None, check_same_thread=False)
    try:
        thread = store.create_thread(NewThread(id="t-1", agent="a"))
        other.execute("BEGIN IMMEDIATE")  # the other process starts a long write ...
        releaser = threading.Timer(0.4, other.execute, args=("COMMIT",))  # ... ends it later
        releaser.start()
        with caplog.at_level(logging.WARNING, logger="dormant.sql"):
            row = store.enqueue(thread.id, "m-1", UserMessage(text="hi"), Priority.INTERACTIVE)
        releaser.join()
        assert [r.id for r in store.inbox(thread.id)] == [row.id]
        assert any("SQLite busy in enqueue" in r.getMessage() for r in caplog.records)
    finally:
        other.close()
        store.close()
