"""One ``LocalSystem`` process on a shared SQLite file, for tests/test_local_tool_claims.py.

``python -m tests.local_process DB_URL RUNS_FILE NAME AFTER THREADS TOTAL``: waits until
process ``AFTER`` has launched its threads (``-`` for none), opens the system, launches
``THREADS`` threads whose agent calls a deferred tool that appends its call id to
``RUNS_FILE``, says so (``<RUNS_FILE>.<NAME>.launched``), and runs until idle, again and
again, until ``TOTAL`` distinct call ids are there: each of those runs also sweeps the
other process's rows. A process opened while the other's tools wait in its pool finds
their rows dispatched and not run, the state a process that died leaves behind.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.messages import Item, ToolResult
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion

DEADLINE_S = 120.0


def _wait_for(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.02)  # polling another process's progress, with a deadline


def main(
    database_url: str, runs_file: str, name: str, after: str, threads: int, total: int
) -> None:
    runs = Path(runs_file)

    @tool(deferred=True)
    def start_job(job: str, ctx: ToolContext) -> None:
        """Start a job elsewhere; its result would arrive later."""
        with runs.open("a") as out:  # one short append per run: lines never interleave
            out.write(f"{ctx.call_id}\n")

    def script(items: Sequence[Item]) -> Completion:
        if isinstance(items[-1], ToolResult):
            return reply("done")
        return reply("starting", call("start_job", job="build"))

    if after != "-":
        _wait_for(Path(f"{runs_file}.{after}.launched").exists, f"{after} to launch")
    agent = Agent("starter", model=ScriptedModel(script), tools=[start_job])
    with LocalSystem([agent], database_url) as system:
        for n in range(threads):
            system.launch("starter", f"job {name}-{n}")
        Path(f"{runs_file}.{name}.launched").touch()

        def all_ran() -> bool:
            system.run_until_idle(timeout_s=DEADLINE_S)
            return len(set(runs.read_text().split() if runs.exists() else [])) >= total

        _wait_for(all_ran, f"{total} tool runs")


if __name__ == "__main__":
    db, runs_path, own, first, count, everything = sys.argv[1:]
    main(db, runs_path, own, first, int(count), int(everything))
