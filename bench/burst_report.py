"""The table ``bench/burst.py`` prints: each measure of a burst, one column a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from burst import Scenario

__all__ = ["report"]

console = Console(width=130)


def report(s: Scenario, runs: dict[str, dict[str, Any]]) -> None:
    title = (
        f"{s.agents} agents launched as {s.burst_priority} at once, {s.rpm:g} RPM / "
        f"{s.tpm:g} TPM ({s.limiter}), one worker of {s.concurrency} slots, "
        f"{s.users} user-facing threads get user text after {s.user_after_s:g} s"
    )
    table = Table(title=title)
    table.add_column("measure")
    for name in runs:
        label = "with admission, --before-code" if name == "before" else f"{name} admission"
        table.add_column(label, justify="right")
    for label, cells in _rows(s, runs):
        table.add_row(label, *cells)
    console.print(table)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _rows(s: Scenario, runs: dict[str, dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The table of issue 23: each measure, then its value in each run."""
    ideal_s = s.agents / s.rpm * 60
    every = runs.values()
    return [
        (
            f"wall time for the burst (ideal at {s.rpm:g} RPM: {ideal_s:.0f} s)",
            [_seconds(r["wall_s"]) for r in every],
        ),
        ("429s answered", [f"{r['answered_429']} of {r['requests']} requests" for r in every]),
        (
            "worker slot time asleep in retry backoff",
            [_asleep(r) for r in every],
        ),
        (
            "utilisation of the limit (served / (RPM x minutes))",
            [f"{r['utilisation']:.0%}" for r in every],
        ),
        ("user text: send → first token (p50)", [_seconds(r["first_token_p50_s"]) for r in every]),
        (
            "user text: send → answer committed (p50)",
            [_seconds(r["committed_p50_s"]) for r in every],
        ),
        (
            "slice tasks (per model call)",
            [f"{r['slice_tasks']} ({_ratio(r['slice_tasks_per_call'])})" for r in every],
        ),
        ("Celery retries of slice tasks", [str(r["retries"]) for r in every]),
        ("deferrals that called no model", [f"{r['deferred_no_model']:.0f}" for r in every]),
        (
            "launches parked without a slice",
            [f"{r.get('parked', 0):.0f}" for r in every],
        ),
        ("longest time with no sweep run", [_seconds(r["longest_sweep_gap_s"]) for r in every]),
        (
            "all agents finished",
            [_finished(r, s.agents) for r in every],
        ),
    ]


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _asleep(r: dict[str, Any]) -> str:
    return f"{r['asleep_s']:.0f} slot-s, {r['asleep_share']:.0%}"


def _finished(r: dict[str, Any], agents: int) -> str:
    said = f"{'yes' if r['all_finished'] else 'no'} ({r['finished']}/{agents}"
    said += f", {r['stalled']} stalled" if r["stalled"] else ""
    said += f", {r['users_stalled']} user threads stalled" if r["users_stalled"] else ""
    return said + (", timed out)" if r["timed_out"] else ")")
