"""``dormant usage`` and ``dormant raise-budget``: what agents spent on their models, and
how an operator lets a thread stopped by its budget go on.

Like the rest of the command, each imports the store only when it runs.
"""

from __future__ import annotations

import json
from contextlib import closing

import typer

from dormant.cli.errors import say
from dormant.cli.options import DatabaseOption, JsonOption, check_since

__all__ = ["raise_budget", "usage"]


def usage(
    agent: str | None = typer.Option(None, "--agent", help="Only this agent's threads."),
    since: str | None = typer.Option(
        None,
        "--since",
        help="Only slices since then: an age (1h, 30m, 7d) or an ISO time.",
        callback=check_since,
    ),
    database_url: str | None = DatabaseOption,
    as_json: bool = JsonOption,
) -> None:
    """Model usage per agent from the ledger: completions, tokens in/out/cached, cost.

    Pruned threads take their usage with them; a model with no price costs 0.
    """
    from rich.console import Console

    from dormant.cli.connect import open_store
    from dormant.ops.usage import parse_since, spend_record, usage_table

    after = parse_since(since) if since is not None else None
    with closing(open_store(database_url)) as store:
        found = store.usage(agent=agent, since=after)
    if as_json:
        typer.echo(json.dumps({name: spend_record(s) for name, s in found.items()}, indent=2))
        return
    if not found:
        typer.echo("no usage recorded" + (f" since {after:%Y-%m-%d %H:%M:%S} UTC" if after else ""))
        return
    Console(width=120).print(usage_table(found))


def raise_budget(
    thread_id: str,
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", min=1, help="Tokens in + out, the whole tree."
    ),
    max_cost: float | None = typer.Option(
        None, "--max-cost", min=0, help="Cost in the prices' currency, the whole tree."
    ),
    max_completions_per_message: int | None = typer.Option(
        None,
        "--max-completions-per-message",
        min=1,
        help="A thread's own completions per user text.",
    ),
    database_url: str | None = DatabaseOption,
) -> None:
    """Set new limits for the budget of the thread's tree and resume the threads it
    stopped (the sweeper re-drives them)."""
    from dormant.budget import BUDGET_KEY
    from dormant.cli.connect import open_store
    from dormant.ops.usage import budget_text
    from dormant.runtime.budgets import raise_limits
    from dormant.runtime.history import pending
    from dormant.stores.base import ThreadStatus

    limits = {
        "max_tokens": max_tokens,
        "max_cost": max_cost,
        "max_completions_per_message": max_completions_per_message,
    }
    if all(v is None for v in limits.values()):
        say("error: give at least one of --max-tokens, --max-cost, --max-completions-per-message")
        raise typer.Exit(2)
    with closing(open_store(database_url)) as store:
        for stopped in raise_limits(store, thread_id, limits):
            calls = store.load(stopped).calls
            store.set_status(stopped, ThreadStatus.WAITING if pending(calls) else ThreadStatus.IDLE)
            typer.echo(f"thread {stopped} resumed; the sweeper re-drives it")
        root = store.thread(store.thread(thread_id).root_id or thread_id)
    typer.echo(f"budget of {root.id}: {budget_text(root.metadata.get(BUDGET_KEY))}")
