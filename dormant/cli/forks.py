"""``dormant fork``: a new thread whose history is another's up to a seq, by reference.

It writes one thread row and wakes nothing, so it needs only the database.
"""

from __future__ import annotations

from contextlib import closing

import typer

from dormant.cli.options import DatabaseOption

__all__ = ["fork"]


def fork(
    thread_id: str,
    at_seq: int = typer.Option(..., "--at-seq", min=1, help="The last item the fork inherits."),
    open_calls: str = typer.Option(
        "cancel",
        "--open-calls",
        help="Calls open at the fork point: cancel (an error result) or keep (pending).",
        metavar="cancel|keep",
    ),
    database_url: str | None = DatabaseOption,
) -> None:
    """Fork THREAD_ID at item --at-seq: prints the new thread's id (see docs/forks.md)."""
    from dormant.cli.connect import open_store
    from dormant.runtime.forks import fork_thread

    if open_calls not in ("cancel", "keep"):
        raise typer.BadParameter("must be cancel or keep", param_hint="--open-calls")
    with closing(open_store(database_url)) as store:
        made = fork_thread(store, thread_id, at_seq, open_calls=open_calls)  # type: ignore[arg-type]
    typer.echo(made.id)
