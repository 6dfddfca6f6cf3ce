"""CPU time of ``import dormant`` and ``dormant --help``, in fresh interpreters.

    python bench/import_cost.py [--runs 7] [--out bench/results/import.json]

Each command runs ``--runs`` times; the figure is the median of the child's user + system
CPU time (``getrusage(RUSAGE_CHILDREN)``), which a busy machine inflates far less than
wall time. Also lists the heavy modules the public names load (they should load none).

``import dormant`` loads the public names on first use, so the cost a program pays is
also measured as ``from dormant import ...`` of the names an embedded program uses.
Children run with ``PYTHONDONTWRITEBYTECODE`` unset, so the warm-up run writes the
bytecode cache an installed package has: without it every run compiles pydantic's source.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
HEAVY = (
    "openai",
    "anthropic",
    "celery",
    "kombu",
    "httpx",
    "typer",
    "rich",
    "click",
    "opentelemetry",
)


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
PUBLIC = "from dormant import Agent, LocalSystem, Client, Settings, tool"


def cpu_s(argv: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=ENV)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def measure(argv: list[str], runs: int) -> dict[str, float]:
    cpu_s(argv)  # warm the file cache and .pyc files
    samples = [cpu_s(argv) for _ in range(runs)]
    return {
        "cpu_s_median": statistics.median(c for c, _ in samples),
        "wall_s_median": statistics.median(w for _, w in samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "import.json")
    args = parser.parse_args()
    probe = f"import sys; {PUBLIC}; print([m for m in {HEAVY!r} if m in sys.modules])"
    heavy = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout.strip()
    results = {
        "import dormant": measure([sys.executable, "-c", "import dormant"], args.runs),
        PUBLIC: measure([sys.executable, "-c", PUBLIC], args.runs),
        "dormant --help": measure([str(BIN / "dormant"), "--help"], args.runs),
        "python -c pass": measure([sys.executable, "-c", "pass"], args.runs),
        "heavy modules after the public names": heavy,
    }
    for name, figures in results.items():
        print(f"{name:>36}: {figures}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
