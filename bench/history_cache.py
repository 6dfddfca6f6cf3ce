"""What each size of the SQL store's history cache buys: throughput and memory per agent.

    python bench/history_cache.py [--sizes 0,1,2,4,8,16,32] [--waves 100,100,100]
        [--turns 20] [--workers 4] [--out bench/results/history_cache.json]

For each size (MiB, ``DORMANT_HISTORY_CACHE_MIB``, ``Settings.history_cache_mib``) the
reference workload runs on SQLite in a fresh process (``bench/workload.py dormant-sqlite``,
so its resident memory is its own), the sizes in the order given, then once more in reverse
order, so a machine that slows down or speeds up during the run moves both ends alike; each
figure is the mean of the two runs. Printed per size, as a curve: completions per
CPU-second (all waves), resident memory per idle agent (the slope over the waves), and
each beside the largest size's. The cache holds items' JSON bytes; a 20-turn thread of the
workload is about 60 KB of it, so a wave of 100 agents works over about 6 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
console = Console(width=130)


def run_size(size_mib: float, waves: str, turns: int, workers: int) -> dict[str, Any]:
    """One ``workload.py dormant-sqlite`` run with the cache bounded at ``size_mib``."""
    argv = [sys.executable, str(HERE / "workload.py"), "dormant-sqlite", "--waves", waves]
    argv += ["--turns", str(turns), "--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DORMANT_HISTORY_CACHE_MIB": str(size_mib)}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"cache {size_mib} MiB failed (exit {out.returncode}):\n{out.stderr}")
    for line in out.stdout.splitlines():
        record = json.loads(line)
        if "result" in record:
            result: dict[str, Any] = record["result"]
            return result
    raise SystemExit(f"cache {size_mib} MiB: no result")


def figures(result: dict[str, Any]) -> dict[str, float]:
    completions = sum(w["completions"] for w in result["waves"])
    cpu_s = sum(w["cpu_s"] for w in result["waves"])
    wall_s = sum(w["wall_s"] for w in result["waves"])
    return {
        "per_cpu_s": completions / cpu_s,
        "per_wall_s": completions / wall_s,
        "rss_per_agent_kb": result["rss_per_idle_agent_bytes"] / 1000,
        "own_us": result["overhead_us_per_completion"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0,1,2,4,8,16,32", help="MiB, comma-separated")
    parser.add_argument("--waves", default="100,100,100")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "history_cache.json")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    runs: dict[float, list[dict[str, float]]] = {size: [] for size in sizes}
    load_before = os.getloadavg()
    for size in [*sizes, *reversed(sizes)]:
        with console.status(f"history cache {size:g} MiB"):
            runs[size].append(figures(run_size(size, args.waves, args.turns, args.workers)))
    curve = {
        size: {key: sum(r[key] for r in got) / len(got) for key in got[0]}
        for size, got in runs.items()
    }
    largest = curve[max(sizes)]
    agents = sum(int(w) for w in args.waves.split(","))
    table = Table(
        title=f"SQLite, {agents} agents in waves of {args.waves} x {args.turns} turns, "
        f"{args.workers} worker threads: the history cache's bound (mean of 2 runs a size)"
    )
    for column in (
        "cache (MiB)",
        "completions / CPU-s",
        "vs largest",
        "own µs a completion",
        "RSS per idle agent",
        "vs largest",
    ):
        table.add_column(column, justify="right")
    for size in sizes:
        c = curve[size]
        table.add_row(
            f"{size:g}",
            f"{c['per_cpu_s']:.0f}",
            f"{c['per_cpu_s'] / largest['per_cpu_s']:.2f}",
            f"{c['own_us']:,.0f}",
            f"{c['rss_per_agent_kb']:.1f} KB",
            f"{c['rss_per_agent_kb'] / largest['rss_per_agent_kb']:.2f}",
        )
    console.print(table)
    results = {
        "waves": args.waves,
        "turns": args.turns,
        "workers": args.workers,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "runs": {str(size): got for size, got in runs.items()},
        "curve": {str(size): c for size, c in curve.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    console.print(f"raw figures: {args.out}")


if __name__ == "__main__":
    main()
