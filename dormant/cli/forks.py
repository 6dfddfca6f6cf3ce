"""``dormant fork``, ``dormant diff`` and ``dormant replay``: a new thread whose history is
another's up to a seq, by reference; how a replay differs from its source; a batch of
replays and its report.

``fork`` and ``diff`` need only the database (a fork writes one thread row and wakes
nothing); ``replay`` needs the deployment, whose workers run the replays.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import typer

from dormant.cli.errors import say
from dormant.cli.options import DatabaseOption, JsonOption, check_since
from dormant.errors import NotFound

if TYPE_CHECKING:
    from dormant.stores.records import WorkerCard

__all__ = ["diff", "fork", "replay"]


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


def replay(
    agent: str = typer.Option(..., "--agent", help="Replay this agent's recorded threads."),
    tag: str = typer.Option(..., "--tag", help="Names the experiment: usage and report."),
    since: str = typer.Option(
        "7d",
        "--since",
        help="Threads made since then: an age (1h, 30m, 7d) or an ISO time.",
        callback=check_since,
    ),
    sample: int = typer.Option(50, "--sample", min=1, help="At most this many, at random."),
    seed: int | None = typer.Option(None, "--seed", help="Repeat a random draw."),
    model: str | None = typer.Option(
        None, "--model", help="A model string to use instead of the agent's (openai:gpt-5)."
    ),
    instructions: str | None = typer.Option(
        None, "--instructions", help="Instructions to use instead of the agent's."
    ),
    on_miss: str = typer.Option(
        "error",
        "--on-miss",
        help="A call the record cannot answer: error, live (side-effect-free tools), stop.",
        metavar="error|live|stop",
    ),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", min=1, help="Each replay's budget: tokens in + out."
    ),
    report: str | None = typer.Option(
        None, "--report", help="Where the JSON report goes (default replay-<tag>.json)."
    ),
    timeout_s: float = typer.Option(
        3600.0, "--timeout-s", min=0, help="Stop waiting then; unfinished runs are marked."
    ),
) -> None:
    """Replay a sample of AGENT's recent threads with a change and write one JSON report
    of their diffs (needs the DORMANT_* URLs: the replays run on the workers)."""
    from pathlib import Path

    from dormant.budget import Budget
    from dormant.cli.connect import open_client
    from dormant.ops.usage import parse_since
    from dormant.replay.batch import pick_sources, replay_batch
    from dormant.replay.tools import ReplayTools

    if on_miss not in ("error", "live", "stop"):
        raise typer.BadParameter("must be error, live or stop", param_hint="--on-miss")
    budget = Budget(max_tokens=max_tokens) if max_tokens is not None else None
    with open_client() as client:
        sources = pick_sources(client.store, agent, parse_since(since), sample, seed=seed)
        if not sources:
            raise NotFound(
                f"agent {agent!r} has no thread to replay (--since {since}; only root"
                " threads are sampled, no child, fork or replay)"
            )
        live_s = 3 * client.settings.announce_interval_s
        if not live_workers_of(client.store.roster(), agent, live_s):
            say(
                f"warning: no live worker runs agent {agent!r} (`dormant versions`): the"
                f" replays wait for one, up to --timeout-s {timeout_s:g}"
            )
        with _progress(len(sources)) as on_progress:
            found = replay_batch(
                client,
                sources,
                tag=tag,
                model=model,
                instructions=instructions,
                tools=ReplayTools(on_miss=on_miss),  # type: ignore[arg-type]
                budget=budget,
                timeout_s=timeout_s,
                on_progress=on_progress,
            )
    found = {"agent": agent, "since": since, "sample": sample, **found}
    path = Path(report or f"replay-{tag}.json")
    path.write_text(json.dumps(found, indent=2, default=str))
    totals = found["totals"]
    typer.echo(
        f"{totals['replays']} replays of {agent} ({tag}): {totals['same']} same, "
        f"{totals['diverged']} diverged, {totals['unfinished']} unfinished; report {path}"
    )


def live_workers_of(roster: list[WorkerCard], agent: str, live_s: float) -> list[str]:
    """The workers that announced ``agent`` within ``live_s`` (a card not renewed for
    three announce intervals is a dead worker's)."""
    since = datetime.now(UTC) - timedelta(seconds=live_s)
    return [c.worker_id for c in roster if agent in c.agents and c.seen_at >= since]


@contextmanager
def _progress(total: int) -> Iterator[Callable[[int, int], None]]:
    """A bar on stderr of the replays finished (on a terminal; elsewhere its last state
    only), so a batch that waits for workers is seen to wait."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = ("replays finished", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("replays", total=total)
        yield lambda done, _total: bar.update(task, completed=done)
