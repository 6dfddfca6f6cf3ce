"""``dormant quarantine``, ``dormant retry`` and ``dormant prune``: the operator's commands
for poison messages, stalled threads and retention.

Like the rest of the command, each imports the store only when it runs.
"""

from __future__ import annotations

from contextlib import closing
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import typer

from dormant.cli.errors import say
from dormant.cli.options import DatabaseOption, check_age

if TYPE_CHECKING:
    from collections.abc import Iterator

    from dormant.stores.base import PruneCounts, Store

__all__ = ["prune", "quarantine", "retry"]


def quarantine(
    limit: int = typer.Option(100, min=1, help="How many messages to list."),
    database_url: str | None = DatabaseOption,
) -> None:
    """Quarantined (poison) messages of every thread, with why; `retry` puts them back.

    One line per message: THREAD MESSAGE (the ids `dormant retry THREAD [MESSAGE]` takes,
    whole), its kind and since when; then the reason, indented.
    """
    from dormant.cli.connect import open_store

    with closing(open_store(database_url)) as store:
        rows = store.quarantined(limit)
    if not rows:
        typer.echo("no quarantined messages")
        return
    for row in rows:
        since = f"{row.created_at:%Y-%m-%d %H:%M:%S}"
        typer.echo(f"{row.thread_id} {row.message_id}  {row.message.kind}, since {since}")
        typer.echo(f"    {row.reason}")


def retry(
    thread_id: str | None = typer.Argument(
        None, help="The thread to re-drive (or --status for every stalled thread)."
    ),
    message_id: str | None = typer.Argument(
        None, help="Only this quarantined message (default: all of the thread's)."
    ),
    status: str | None = typer.Option(
        None, "--status", help="Instead of THREAD: every thread with this status ('stalled')."
    ),
    agent: str | None = typer.Option(None, "--agent", help="With --status: only this agent's."),
    database_url: str | None = DatabaseOption,
) -> None:
    """Re-drive a thread: un-stall it and requeue its quarantined messages.

    The next sweep applies them, after any input the thread processed meanwhile.
    `dormant retry --status stalled [--agent A]` re-drives every stalled thread (after a
    deploy that brings back a missing agent, say), one line each.
    """
    from dormant.cli.connect import open_store

    if thread_id is None and status is None:
        why = "give a THREAD, or --status stalled for every stalled thread"
        raise typer.BadParameter(why, param_hint="THREAD")
    if thread_id is not None and status is not None:
        raise typer.BadParameter("give a THREAD or --status stalled, not both", param_hint="THREAD")
    if status is not None and status != "stalled":
        why = f"{status!r}: only 'stalled' threads are re-driven in bulk"
        raise typer.BadParameter(why, param_hint="--status")
    if agent is not None and status is None:
        raise typer.BadParameter("--agent goes with --status", param_hint="--agent")
    with closing(open_store(database_url)) as store:
        if thread_id is not None:
            _retry_one(store, thread_id, message_id)
            return
        count = 0
        for stalled in _stalled(store, agent):
            _retry_one(store, stalled, None)
            count += 1
    typer.echo(f"{count} stalled thread(s) re-driven" + (f" of agent {agent}" if agent else ""))


def _stalled(store: Store, agent: str | None) -> Iterator[str]:
    """The ids of the stalled threads (of ``agent``), page by page (keyset paging: a
    page re-driven does not move the next)."""
    from dormant.stores.base import ThreadStatus

    before: tuple[datetime, str] | None = None
    while page := store.threads(ThreadStatus.STALLED, 500, agent=agent, before=before):
        yield from (t.id for t in page)
        before = (page[-1].created_at, page[-1].id)


def _retry_one(store: Store, thread_id: str, message_id: str | None) -> None:
    from dormant.ops.retry import redrive

    done = redrive(store, thread_id, message_id)
    status = done.thread.status
    if not done.unstalled and not done.released:
        say(
            f"error: thread {thread_id!r} is {status.value}, not stalled, and has no "
            "quarantined messages"
        )
        raise typer.Exit(1)
    for row in done.released:
        typer.echo(f"message {row.message_id} is queued again")
    typer.echo(f"thread {thread_id} is {status.value}; the sweeper re-drives it")


def prune(
    older_than: str = typer.Option(
        ...,
        "--older-than",
        help="Age of what is deleted: 30d, 12h, 2w (s, m, h, d, w).",
        callback=check_age,
    ),
    batch: int = typer.Option(500, "--batch", min=1, help="Rows or thread trees per transaction."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would go; delete nothing."),
    database_url: str | None = DatabaseOption,
) -> None:
    """Delete closed threads and finished rows older than --older-than, in small batches.

    Closed thread trees go with their items, calls, inbox, outbox and timers; finished
    inbox rows, ran outbox rows and fired timers of live threads go too. A message for a
    pruned thread is refused as an unknown thread.
    """
    from rich.console import Console

    from dormant.cli.connect import open_store
    from dormant.ops.prune import parse_age
    from dormant.ops.prune import prune as run_prune
    from dormant.stores.base import PruneCounts

    cutoff = datetime.now(UTC) - parse_age(older_than)
    console = Console(stderr=True)
    done = PruneCounts()

    def progress(counts: PruneCounts) -> None:
        nonlocal done
        done += counts
        console.print(f"[dim]batch: {_describe(counts)}; so far {done.total} rows[/dim]")

    with closing(open_store(database_url)) as store:
        total = run_prune(store, cutoff, batch=batch, dry_run=dry_run, on_batch=progress)
    verb = "would delete" if dry_run else "deleted"
    typer.echo(f"{verb} {_describe(total)} (older than {cutoff:%Y-%m-%d %H:%M:%S} UTC)")


def _describe(counts: PruneCounts) -> str:
    return (
        f"{counts.threads} threads, {counts.inbox} inbox rows, {counts.outbox} outbox rows, "
        f"{counts.timers} timers"
    )
