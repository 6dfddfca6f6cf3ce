"""Instructions a completion of the reference workload, counted by valgrind: a figure the
machine's load does not move (docs/benchmarks.md, "SQLite per completion, counted in
instructions").

    python bench/instructions.py [--systems dormant-memory,dormant-sqlite] [--agents 10,30]
        [--turns 5] [--out bench/results/instructions.json]

For each system, ``bench/workload.py`` runs under ``valgrind --tool=callgrind`` at the two
sizes (both at once, one a core); the difference of the two totals over the completions
between them is one completion's instructions, start-up and imports taken out. A warm-up
run writes the bytecode caches first, so neither counts compiling. Prints each system and
the memory store ÷ SQLite ratio (issue 35's target: >= 0.7, in CPU-seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLLECTED = re.compile(r"Collected : (\d+)")


def counted(system: str, agents: int, turns: int) -> int:
    """The instructions of one whole workload run under callgrind."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        run = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                str(HERE / "workload.py"),
                system,
                "--waves",
                str(agents),
                "--turns",
                str(turns),
            ],
            cwd=HERE,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            capture_output=True,
            text=True,
            check=True,
        )
    found = COLLECTED.findall(run.stderr)
    if not found:
        raise SystemExit(f"valgrind printed no total for {system}:\n{run.stderr[-2000:]}")
    return int(found[-1])


def per_completion(system: str, small: int, large: int, turns: int) -> float:
    subprocess.run(  # the bytecode caches, so that no run below counts compiling
        [sys.executable, str(HERE / "workload.py"), system, "--waves", "2", "--turns", "1"],
        cwd=HERE,
        capture_output=True,
        check=True,
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        few, many = pool.map(lambda n: counted(system, n, turns), (small, large))
    completions = (large - small) * turns * 2  # two completions a turn
    return (many - few) / completions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default="dormant-memory,dormant-sqlite")
    parser.add_argument("--agents", default="10,30", help="the two sizes, SMALL,LARGE")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "instructions.json")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    small, large = (int(n) for n in args.agents.split(","))
    if not 0 < small < large:
        raise SystemExit(f"--agents needs two sizes, the smaller first: {args.agents!r}")
    results: dict[str, float] = {}
    for system in args.systems.split(","):
        print(f"{system}: counting at {small} and {large} agents...", file=sys.stderr, flush=True)
        results[system] = per_completion(system, small, large, args.turns)
        print(f"{system}: {results[system] / 1e6:.2f} M instructions a completion", flush=True)
    figures: dict[str, object] = {
        "agents": [small, large],
        "turns": args.turns,
        "instructions_per_completion": results,
    }
    if {"dormant-memory", "dormant-sqlite"} <= results.keys():
        ratio = results["dormant-memory"] / results["dormant-sqlite"]
        figures["memory_over_sqlite"] = ratio
        print(f"memory store / SQLite, per instruction: {ratio:.2f} (target >= 0.7)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
