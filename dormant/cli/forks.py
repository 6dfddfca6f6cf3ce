"""``dormant fork`` and ``dormant diff``: a new thread whose history is another's up to a
seq, by reference; how a replay differs from its source.

Both need only the database: a fork writes one thread row and wakes nothing.
"""

from __future__ import annotations

import json
from contextlib import closing

import typer

from dormant.cli.options import DatabaseOption, JsonOption

__all__ = ["diff", "fork"]


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


def diff(
    source_id: str,
    replay_id: str,
    database_url: str | None = DatabaseOption,
    as_json: bool = JsonOption,
) -> None:
    """How REPLAY_ID differs from SOURCE_ID past its fork point (see docs/forks.md)."""
    from dormant.cli.connect import open_store
    from dormant.replay.diff import diff_threads

    with closing(open_store(database_url)) as store:
        found = diff_threads(store, source_id, replay_id)
    if as_json:
        typer.echo(json.dumps(found.as_json(), indent=2, default=str))
        return
    first = found.first_divergence
    typer.echo(
        f"replay {found.replay_id} of {found.source_id}: " + ("same" if found.same else "differs")
    )
    if first is not None:
        seqs = f"source seq {first.source_seq}, replay seq {first.replay_seq}"
        typer.echo(f"first divergence at step {first.step} ({seqs}):")
        typer.echo(f"  source: {first.source or '(nothing)'}")
        typer.echo(f"  replay: {first.replay or '(nothing)'}")
    counts = f"calls served {found.served}, missed {found.missed}, live {found.live}"
    typer.echo(f"tool-sequence distance {found.tool_distance}; {counts}")
    typer.echo(f"source answer: {found.source_answer}")
    typer.echo(f"replay answer: {found.replay_answer}")
    deltas = ", ".join(f"{k} {v:+g}" for k, v in found.deltas.items())
    typer.echo(f"replay - source: {deltas}")
