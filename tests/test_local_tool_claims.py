"""``LocalSystem`` claims each tool run in the store, as a Celery tool task does: a row
sent twice (by another process's sweeper, or by this one's while the first copy waits in
the pool) runs once.

Each tool here is deferred: its call stays pending after it ran, so only the claim (not the
call's state) can keep a second copy from running it again.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.messages import Item, ToolResult
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.settings import Settings
from dormant.stores.sql.store import SQLStore, upgrade

ROOT = Path(__file__).resolve().parent.parent


def _spawn(
    url: str, runs: Path, name: str, after: str, threads: int, total: int
) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.local_process", url, str(runs), name, after]
    return subprocess.Popen(
        [*command, str(threads), str(total)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.timeout(600)
def test_two_local_systems_on_one_sqlite_file_run_each_tool_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/shared.db"
    runs = tmp_path / "runs.txt"
    per_process = 75
    # The second opens the file once the first has launched its threads: while the
    # first's tools are still queued, and while both slices and sweepers run.
    first = _spawn(url, runs, "a", "-", per_process, 2 * per_process)
    second = _spawn(url, runs, "b", "a", per_process, 2 * per_process)
    outputs = [process.communicate(timeout=300)[0] for process in (first, second)]
    assert (first.returncode, second.returncode) == (0, 0), "\n".join(outputs)
    counted = Counter(runs.read_text().split())
    assert len(counted) == 2 * per_process
    twice = {call_id: n for call_id, n in counted.items() if n > 1}
    assert twice == {}, f"{len(twice)} of {len(counted)} tools ran more than once"


def _upgrade_each(urls: list[str], start: Barrier) -> None:
    for url in urls:
        start.wait(timeout=60)
        upgrade(url)


def test_two_processes_opening_one_new_sqlite_file_at_once_both_migrate_it(
    tmp_path: Path,
) -> None:
    """Both find no tables and create them; the second used to fail with "database is
    locked" or "table dormant_alembic_version already exists"."""
    urls = [f"sqlite:///{tmp_path}/new-{attempt}.db" for attempt in range(3)]
    # spawn, not fork: a fork of this many-threaded test process can inherit a lock some
    # other thread holds (logging's, an import's) and hang at the barrier
    spawned = multiprocessing.get_context("spawn")
    start = spawned.Barrier(2)
    openers = [spawned.Process(target=_upgrade_each, args=(urls, start)) for _ in range(2)]
    for opener in openers:
        opener.start()
    for opener in openers:
        opener.join(timeout=120)
    assert [opener.exitcode for opener in openers] == [0, 0]
    for url in urls:
        store = SQLStore(url)
        try:
            assert store.threads() == []
        finally:
            store.close()


@pytest.mark.parametrize("database", ["memory", "sqlite"])
def test_a_tool_waiting_in_a_busy_pool_runs_once_though_the_sweeper_sends_it_again(
    database: str, tmp_path: Path
) -> None:
    """Under load a tool's row waits in the pool longer than the sweeper's lost-task
    timeout, so the sweeper sends it again while the first copy is queued or running."""
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    @tool(deferred=True)
    def start_job(job: str, ctx: ToolContext) -> None:
        """Start a job elsewhere; its result would arrive later."""
        time.sleep(0.01)  # the tool's own work: what keeps the pool busy
        with lock:
            runs[ctx.call_id] += 1

    def script(items: Sequence[Item]) -> Completion:
        if isinstance(items[-1], ToolResult):
            return reply("done")
        return reply("starting", call("start_job", job="build"))

    agent = Agent("starter", model=ScriptedModel(script), tools=[start_job])
    url = "memory://" if database == "memory" else f"sqlite:///{tmp_path}/busy.db"
    settings = Settings(
        database_url=url, sweep_interval_s=0.01, outbox_grace_s=0.0, visibility_timeout_s=0.05
    )
    threads = 100
    with LocalSystem([agent], settings=settings, workers=2) as system:
        for n in range(threads):
            system.launch("starter", f"job {n}")
        system.run_until_idle(timeout_s=120)
    assert len(runs) == threads
    twice = {call_id: n for call_id, n in runs.items() if n > 1}
    assert twice == {}, f"{len(twice)} of {threads} tools ran more than once"
