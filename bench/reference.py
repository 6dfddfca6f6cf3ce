"""The reference workload on dormant (memory, SQLite) and LangGraph, each in its own process.

    python bench/reference.py [--waves 1000,4000,5000,10000] [--langgraph-waves ...]
                              [--turns 20] [--out bench/results/reference.json]

Every system runs ``bench/workload.py`` in a fresh subprocess (so resident memory is its
own), LangGraph with ``bench/.venv-langgraph/bin/python`` (``make bench`` creates it).
Prints one table and writes the raw figures as JSON. Memory figures are refused (printed
as "refused") when the simulated text does not compress like real model output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LANGGRAPH_PYTHON = HERE / ".venv-langgraph" / "bin" / "python"
console = Console(width=130)


def run_system(
    system: str, waves: str, turns: int, workers: int, progress: Progress
) -> dict[str, Any]:
    python = str(LANGGRAPH_PYTHON) if system == "langgraph" else sys.executable
    argv = [python, str(HERE / "workload.py"), system, "--waves", waves, "--turns", str(turns)]
    argv += ["--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    task = progress.add_task(system, total=None)
    result: dict[str, Any] | None = None
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) as child:
        assert child.stdout is not None
        for line in child.stdout:
            record = json.loads(line)
            if "progress" in record:
                progress.update(task, completed=record["progress"], total=record["total"])
            else:
                result = record["result"]
    if child.returncode != 0 or result is None:
        raise SystemExit(f"{system} failed (exit {child.returncode})")
    return result


def totals(result: dict[str, Any]) -> tuple[float, float]:
    """Completions per wall-second and per CPU-second over all waves."""
    completions = sum(w["completions"] for w in result["waves"])
    wall = sum(w["wall_s"] for w in result["waves"])
    cpu = sum(w["cpu_s"] for w in result["waves"])
    return completions / wall, completions / cpu


def kb(result: dict[str, Any], key: str) -> str:
    if not result["compression_in_band"]:
        return "refused"
    value = result[key]
    return "-" if value is None else f"{value / 1024:,.1f}"


def report(results: dict[str, dict[str, Any]]) -> None:
    table = Table(title="Reference workload (20 turns, 40 completions per agent)")
    for column in ("system", "agents", "compl./wall-s", "compl./CPU-s", "KB RSS/idle agent"):
        table.add_column(column, justify="right")
    table.add_column("KB stored/agent", justify="right")
    table.add_column("zlib ratio", justify="right")
    table.add_column("own µs/compl.", justify="right")
    table.add_column("model µs/compl.", justify="right")
    for name, result in results.items():
        per_wall, per_cpu = totals(result)
        agents = sum(w["agents"] for w in result["waves"])
        table.add_row(
            name,
            f"{agents:,}",
            f"{per_wall:,.0f}",
            f"{per_cpu:,.0f}",
            kb(result, "rss_per_idle_agent_bytes"),
            kb(result, "stored_bytes_per_agent"),
            f"{result['compression_ratio']:.2f}",
            f"{result['overhead_us_per_completion']:,.0f}",
            f"{result['model_cpu_us_per_completion']:,.0f}",
        )
    console.print(table)
    console.print(
        "own µs/compl.: the system's CPU per completion less the simulated model's own "
        "(model µs/compl.: its text, streamed in 48-character chunks, measured alone)"
    )
    for name, result in results.items():
        if not result["compression_in_band"]:
            console.print(
                f"[red]{name}: text compresses {result['compression_ratio']:.2f}x, "
                "outside 2.5-3.5x: memory figures refused[/red]"
            )
    if "dormant-memory" in results and "langgraph" in results:
        mem, lg = results["dormant-memory"], results["langgraph"]
        console.print(
            f"dormant (memory) / LangGraph (InMemorySaver): "
            f"{totals(mem)[1] / totals(lg)[1]:.1f}x completions per CPU-second, "
            f"{totals(mem)[0] / totals(lg)[0]:.1f}x per wall-second"
        )
    if "dormant-memory" in results and "dormant-sqlite" in results:
        mem, sql = results["dormant-memory"], results["dormant-sqlite"]
        console.print(
            f"SQLite / memory store: {totals(sql)[1] / totals(mem)[1]:.2f}x per CPU-second, "
            f"{totals(sql)[0] / totals(mem)[0]:.2f}x per wall-second"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", default="1000,4000,5000,10000")
    parser.add_argument("--sqlite-waves", default=None, help="default: --waves")
    parser.add_argument("--langgraph-waves", default=None, help="default: --waves")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--systems", default="dormant-memory,dormant-sqlite,langgraph")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "reference.json")
    args = parser.parse_args()
    waves = {
        "dormant-memory": args.waves,
        "dormant-sqlite": args.sqlite_waves or args.waves,
        "langgraph": args.langgraph_waves or args.waves,
    }
    if "langgraph" in args.systems and not LANGGRAPH_PYTHON.exists():
        raise SystemExit(f"{LANGGRAPH_PYTHON} is missing: run `make bench-env` first")
    results: dict[str, dict[str, Any]] = {}
    started = time.time()
    columns = (
        TextColumn("{task.description:>16}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} turns"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        for system in args.systems.split(","):
            results[system] = run_system(system, waves[system], args.turns, args.workers, progress)
    report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {"started": started, "cpus": os.cpu_count(), "results": results}
    args.out.write_text(json.dumps(document, indent=1))
    console.print(f"raw figures: {args.out}")


if __name__ == "__main__":
    main()
