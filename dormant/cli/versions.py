"""``dormant versions``: which agent versions the workers run, from the roster of workers.

During a rolling deploy it shows the old and the new version side by side and which
workers still run each: a version with no live worker left is drained.
"""

from __future__ import annotations

import json
from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import Any

import typer

__all__ = ["versions"]

DatabaseOption = typer.Option(None, "--database-url", help="Defaults to DORMANT_DATABASE_URL.")


def versions(
    database_url: str | None = DatabaseOption,
    as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout instead of text."),
) -> None:
    """The agent versions the workers announced: live workers, last seen, tools.

    A worker is live while it renews its card (every DORMANT_ANNOUNCE_INTERVAL_S); a card
    is kept a week after its worker was last seen.
    """
    from rich.table import Table
    from rich.text import Text

    from dormant.cli.connect import open_store
    from dormant.cli.output import print_rich
    from dormant.settings import Settings

    live_s = 3 * Settings.from_env().announce_interval_s
    with closing(open_store(database_url)) as store:
        records = version_records(store.roster(), datetime.now(UTC), live_s)
        records = with_thread_counts(records, store.open_threads_by_version())
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    if not records:
        typer.echo("no worker has announced itself yet (workers announce when they start)")
        return
    table = Table("agent", "version", "open threads", "live workers", "last seen (UTC)", "tools")
    for column in table.columns:  # ids a deploy is checked by: folded, never cut short
        column.overflow = "fold"
    for r in records:
        live = ", ".join(r["live_workers"]) or "none: drained"
        seen = r["last_seen"][:19] if r["last_seen"] else "-"
        tools = ", ".join(r["tools"])
        cells = (r["agent"], r["version"] or "-", str(r["open_threads"]), live, seen, tools)
        table.add_row(*map(Text, cells))  # names and versions, never markup
    print_rich(table)


def with_thread_counts(
    records: list[dict[str, Any]], counts: dict[tuple[str, str], int]
) -> list[dict[str, Any]]:
    """``records`` with each version's open threads (last run by it), and a record for
    versions that threads name and no worker announced (a version ``-`` is a thread no
    slice ran yet)."""
    known = {(r["agent"], r["version"]) for r in records}
    extra = [
        {"agent": a, "version": v, "live_workers": [], "tools": [], "last_seen": ""}
        for a, v in sorted(counts)
        if (a, v) not in known
    ]
    return [
        {**r, "open_threads": counts.get((r["agent"], r["version"]), 0)} for r in records + extra
    ]


def version_records(roster: list[Any], now: datetime, live_s: float) -> list[dict[str, Any]]:
    """One record per (agent, version) across the roster's cards, newest first; the
    built-in tools every agent has are left out."""
    from dormant.tools.builtins import BUILTINS

    by_version: dict[tuple[str, str], dict[str, Any]] = {}
    for card in roster:
        live = card.seen_at >= now - timedelta(seconds=live_s)
        for agent, have in card.agents.items():
            record = by_version.setdefault(
                (agent, have.version),
                {"agent": agent, "version": have.version, "live_workers": [], "tools": set()},
            )
            if live:
                record["live_workers"].append(card.worker_id)
            record["tools"] |= have.tools - BUILTINS.keys()
            seen = record.get("last_seen")
            record["last_seen"] = max(seen, card.seen_at) if seen else card.seen_at
    records = sorted(by_version.values(), key=lambda r: (r["agent"], r["last_seen"]), reverse=True)
    return [
        {**r, "tools": sorted(r["tools"]), "last_seen": r["last_seen"].isoformat()} for r in records
    ]
