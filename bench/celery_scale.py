"""Idle threads in bulk for ``bench/celery_throughput.py``, and a worker's resident memory.

A realistic idle thread is a finished one: ``make_template`` runs one agent for 20 turns of
the reference workload (a tool call and its delivered result each turn) on the bench's own
PostgreSQL database through ``LocalSystem``; ``add_idle_threads`` copies its rows
(thread, items, calls, finished inbox rows, ran outbox rows) ``count`` times with
``INSERT ... SELECT`` over ``generate_series``, since launching 100,000 threads one by one
would take hours, then vacuums and analyzes the tables, as autovacuum would.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from sqlalchemy import Engine, text

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.models import SimulatedModel

TEMPLATE = "template"
_COPIED = ("threads", "items", "calls", "inbox", "outbox")
_SERIAL = {"inbox": "id", "outbox": "id"}
"""Columns a copy leaves to their sequence."""


def make_template(database_url: str, turns: int = 20) -> None:
    """Run thread ``template`` (agent ``chat``) through ``turns`` reference turns."""
    pending: list[str] = []

    @tool(deferred=True)
    def wait_build(target: str, ctx: ToolContext) -> None:
        """Start a CI build."""
        pending.append(ctx.call_id)

    model = SimulatedModel(call_every=1, tool="wait_build", tool_args={"target": "x"})
    agent = Agent("chat", model=model, tools=[wait_build])
    with LocalSystem([agent], database_url=database_url, workers=1) as system:
        for turn in range(turns):
            if turn == 0:
                system.launch("chat", "check build 0", thread_id=TEMPLATE)
            else:
                system.send(TEMPLATE, f"check build {turn}")
            system.run_until_idle(timeout_s=300)
            system.deliver(TEMPLATE, pending.pop(), "build green")
            system.run_until_idle(timeout_s=300)


def add_idle_threads(
    engine: Engine,
    prefix: str,
    count: int,
    batch: int = 5000,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Insert ``count`` copies of the template thread, ids ``{prefix}{n}``, one transaction
    per ``batch`` copies; ``progress`` is told how many were added after each."""
    if count <= 0:
        return
    with engine.connect() as conn:
        start = int(
            conn.execute(
                text("SELECT count(*) FROM threads WHERE id LIKE :p"), {"p": prefix + "%"}
            ).scalar_one()
        )
        columns = {
            table: [
                row[0]
                for row in conn.execute(
                    text(
                        "SELECT column_name FROM information_schema.columns "
                        "WHERE table_name = :t ORDER BY ordinal_position"
                    ),
                    {"t": table},
                )
            ]
            for table in _COPIED
        }
    for first in range(start, start + count, batch):
        last = min(first + batch, start + count) - 1
        with engine.begin() as conn:
            for table in _COPIED:
                sql = _copy_sql(table, columns[table], prefix)
                conn.execute(text(sql), {"a": first, "b": last})
        if progress is not None:
            progress(last + 1 - start)
    # A deployment grows gradually and autovacuum keeps the planner's statistics current
    # (and the visibility map that index-only scans need); right after a bulk copy they are
    # missing, and the planner guessed 200,000 items per thread (docs/benchmarks.md, idle
    # scale). Measure the steady state.
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text(f"VACUUM (ANALYZE) {', '.join(_COPIED)}")
        )


def _copy_sql(table: str, columns: list[str], prefix: str) -> str:
    key = "id" if table == "threads" else "thread_id"
    kept = [c for c in columns if c != _SERIAL.get(table)]
    new_id = f"'{prefix}' || g"
    chosen = []
    for column in kept:
        if column in (key, "root_id"):
            chosen.append(new_id)
        else:
            chosen.append(f"t.{column}" if column != "metadata" else 't."metadata"')
    names = ", ".join(f'"{c}"' for c in kept)
    return (
        f"INSERT INTO {table} ({names}) SELECT {', '.join(chosen)} FROM {table} t, "
        f"generate_series(CAST(:a AS integer), CAST(:b AS integer)) g WHERE t.{key} = '{TEMPLATE}'"
    )


def worker_rss_bytes(pid: int) -> int:
    """Resident memory of a process and its children (a Celery worker is one process with
    ``-P threads``, but count any children all the same)."""
    total = 0
    for candidate in [pid, *_children(pid)]:
        try:
            with open(f"/proc/{candidate}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except FileNotFoundError:
            continue
    return total


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []
