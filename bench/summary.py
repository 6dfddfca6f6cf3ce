"""The performance targets of issues 22 and 35, each beside the figure the benches wrote.

    python bench/summary.py [--results bench/results] [--before DIR]

Reads ``reference.json`` and ``celery.json`` (``make bench``; ``make bench-full`` writes
them under ``bench/results/full``) and, when present, ``idle_scale.json``, ``burst.json``
(slice tasks per model call under a burst, issue 35) and ``instructions.json`` (SQLite
against the memory store in counted instructions, which the machine's load does not
move: ``make bench-full``). With
``--before``, the same files of an earlier run (another commit, the same machine) fill a
"before" column. Beside each measure, the runtime's own CPU per completion in microseconds
and the simulated model's: the distance to the floor. A figure a results file lacks (an
older run, a phase not run) prints as "-".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference import totals
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
console = Console(width=160)
Figures = dict[str, Any]
Measure = Callable[[Figures], float | None]
Check = Callable[[Figures], bool | None]


@dataclass(frozen=True)
class Row:
    """One measure: how to read it from a run's figures, its target, and its CPU costs."""

    measure: str
    target: str
    value: Callable[[Figures], str]
    met: Check
    own_us: Callable[[Figures], str]


def load(results: Path) -> Figures:
    figures: Figures = {}
    for name in ("reference", "celery", "idle_scale", "burst", "instructions"):
        path = results / f"{name}.json"
        if path.exists():
            figures[name] = json.loads(path.read_text())
    return figures


def get(figures: Figures, *path: str) -> Any:
    """The value at ``path``, or None when a run did not measure it."""
    value: Any = figures
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def system(figures: Figures, name: str) -> Figures | None:
    result: Figures | None = get(figures, "reference", "results", name)
    return result


def per_cpu_s(figures: Figures, name: str) -> float | None:
    result = system(figures, name)
    return None if result is None else totals(result)[1]


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def shown(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def own_us(figures: Figures, name: str) -> str:
    return shown(get(figures, "reference", "results", name, "overhead_us_per_completion"), ",.0f")


def less_model(figures: Figures, cpu_us: float | None) -> str:
    """A worker's CPU per completion less the simulated model's share of it."""
    model = get(figures, "celery", "model_cpu_us_per_completion")
    return shown(None if cpu_us is None or model is None else cpu_us - model, ",.0f")


def idle_sizes(figures: Figures) -> tuple[Figures, Figures] | None:
    sizes = get(figures, "idle_scale", "sizes")
    if not sizes or len(sizes) < 2:
        return None
    return sizes[min(sizes, key=int)], sizes[max(sizes, key=int)]


def bytes_per_idle_thread(figures: Figures) -> float | None:
    """On-disk bytes per thread added from the smallest size to the largest."""
    pair = idle_sizes(figures)
    if pair is None:
        return None
    few, many = pair

    def on_disk(size: Figures) -> int:
        return sum(parts["total"] for parts in size["relations"].values())

    return (on_disk(many) - on_disk(few)) / (many["idle_threads"] - few["idle_threads"])


def idle_ratio(figures: Figures, *path: str) -> float | None:
    pair = idle_sizes(figures)
    return None if pair is None else ratio(get(pair[1], *path), get(pair[0], *path))


def at_most(
    limit: float, value: Callable[[Figures], float | None]
) -> Callable[[Figures], bool | None]:
    return lambda f: None if (v := value(f)) is None else v <= limit


def at_least(
    limit: float, value: Callable[[Figures], float | None]
) -> Callable[[Figures], bool | None]:
    return lambda f: None if (v := value(f)) is None else v >= limit


def rss_kb(f: Figures) -> float | None:
    value = get(f, "reference", "results", "dormant-memory", "rss_per_idle_agent_bytes")
    return None if value is None else value / 1024


def vs_langgraph(f: Figures) -> float | None:
    return ratio(per_cpu_s(f, "dormant-memory"), per_cpu_s(f, "langgraph"))


def sqlite_vs_memory(f: Figures) -> float | None:
    return ratio(per_cpu_s(f, "dormant-sqlite"), per_cpu_s(f, "dormant-memory"))


def send_ratio(f: Figures) -> float | None:
    return get(f, "celery", "throughput", "1", "send_ratio")


def wake_ratio(f: Figures) -> float | None:
    low = get(f, "celery", "latency", "low_load") or {}
    return ratio(get(low, "deliver", "p50_ms"), get(low, "noop", "p50_ms"))


def sqlite_vs_memory_instructions(f: Figures) -> float | None:
    """The same ratio in instructions a completion (``bench/instructions.py``)."""
    return get(f, "instructions", "memory_over_sqlite")


def instructions_m(f: Figures, system: str) -> str:
    count = get(f, "instructions", "instructions_per_completion", system)
    return "-" if count is None else f"{count / 1e6:.2f} M"


def waiting_ratio(f: Figures) -> float | None:
    return get(f, "celery", "waiting", "ratio")


def waiting_size(f: Figures) -> str:
    agents, wait_s = get(f, "celery", "sizes", "wait_agents"), get(f, "celery", "sizes", "wait_s")
    return "" if agents is None else f" ({agents} x {wait_s:g} s)"


def burst_tasks_per_call(f: Figures) -> float | None:
    """Slice tasks per model call under the burst, admission on (issue 35)."""
    return get(f, "burst", "runs", "with", "slice_tasks_per_call")


def burst_size(f: Figures) -> str:
    agents, rpm = get(f, "burst", "scenario", "agents"), get(f, "burst", "scenario", "rpm")
    return "" if agents is None else f" ({agents} agents, {rpm:g} RPM)"


def celery_us(f: Figures, phase: tuple[str, ...], own: str, baseline: str) -> str:
    """The worker's CPU per slice less the model's, beside the baseline task's CPU."""
    slice_us = less_model(f, get(f, "celery", *phase, own))
    task_us = shown(get(f, "celery", *phase, baseline), ",.0f")
    return "-" if slice_us == "-" else f"{slice_us} (task {task_us})"


ROWS = (
    Row(
        "RSS per idle agent, memory store (KB)",
        "<= 20",
        lambda f: shown(rss_kb(f), ".1f"),
        at_most(20, rss_kb),
        lambda f: own_us(f, "dormant-memory"),
    ),
    Row(
        "completions per CPU-s vs LangGraph",
        ">= 20",
        lambda f: shown(vs_langgraph(f), ".1f"),
        at_least(20, vs_langgraph),
        lambda f: f"{own_us(f, 'dormant-memory')} (LangGraph {own_us(f, 'langgraph')})",
    ),
    Row(
        "Celery, 1 worker: slices/s / no-ops/s, from send",
        ">= 0.5",
        lambda f: shown(send_ratio(f), ".2f"),
        at_least(0.5, send_ratio),
        lambda f: celery_us(f, ("throughput", "1"), "slice_cpu_us", "noop_cpu_us"),
    ),
    Row(
        "one sender: Client.send/s / send_task/s",
        "",
        lambda f: shown(get(f, "celery", "throughput", "1", "sender_ratio"), ".2f"),
        lambda f: None,
        lambda f: "",
    ),
    Row(
        "Celery: deliver -> start p50 / no-op p50",
        "<= 1.2",
        lambda f: shown(wake_ratio(f), ".2f"),
        at_most(1.2, wake_ratio),
        lambda f: celery_us(f, ("latency", "low_load"), "deliver_cpu_us", "noop_cpu_us"),
    ),
    Row(
        "waiting: blocking wall / dormant wall",
        ">= 20 at 200 x 5 s",
        lambda f: shown(waiting_ratio(f), ".1f") + waiting_size(f),
        at_least(20, waiting_ratio),
        lambda f: celery_us(f, ("waiting",), "dormant_cpu_us", "blocking_cpu_us"),
    ),
    Row(
        "SQLite / memory store, per CPU-s",
        ">= 0.7",
        lambda f: shown(sqlite_vs_memory(f), ".2f"),
        at_least(0.7, sqlite_vs_memory),
        lambda f: f"{own_us(f, 'dormant-sqlite')} (memory {own_us(f, 'dormant-memory')})",
    ),
    Row(
        "SQLite / memory store, per instruction",
        ">= 0.7",
        lambda f: shown(sqlite_vs_memory_instructions(f), ".2f"),
        at_least(0.7, sqlite_vs_memory_instructions),
        lambda f: (
            f"{instructions_m(f, 'dormant-sqlite')} instr. "
            f"(memory {instructions_m(f, 'dormant-memory')})"
        ),
    ),
    Row(
        "burst: slice tasks per model call",
        "<= 1.2",
        lambda f: shown(burst_tasks_per_call(f), ".2f") + burst_size(f),
        at_most(1.2, burst_tasks_per_call),
        lambda f: "",
    ),
    Row(
        "PostgreSQL: disk bytes per idle thread",
        "<= 10,240",
        lambda f: shown(bytes_per_idle_thread(f), ",.0f"),
        at_most(10_240, bytes_per_idle_thread),
        lambda f: "",
    ),
    Row(
        "PostgreSQL: wake p50, most / fewest idle",
        "<= 1.10",
        lambda f: shown(idle_ratio(f, "deliver", "p50_ms"), ".2f"),
        at_most(1.10, lambda f: idle_ratio(f, "deliver", "p50_ms")),
        lambda f: "",
    ),
    Row(
        "PostgreSQL: worker RSS, most / fewest idle",
        "<= 1.10",
        lambda f: shown(idle_ratio(f, "worker_rss_bytes"), ".2f"),
        at_most(1.10, lambda f: idle_ratio(f, "worker_rss_bytes")),
        lambda f: "",
    ),
)


def model_us(figures: Figures) -> str:
    value = get(figures, "reference", "results", "dormant-memory", "model_cpu_us_per_completion")
    return shown(value, ",.0f")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--before", type=Path, help="the results directory of an earlier run")
    args = parser.parse_args()
    after = load(args.results)
    before = load(args.before) if args.before else None
    table = Table(title=f"Performance targets, issues 22 and 35 ({args.results})")
    table.add_column("measure")
    table.add_column("target", justify="right")
    if before is not None:
        table.add_column("before", justify="right")
    table.add_column("after" if before is not None else "now", justify="right")
    table.add_column("met", justify="center")
    if before is not None:
        table.add_column("own µs, before", justify="right")
    table.add_column("own µs", justify="right")
    for row in ROWS:
        met = {True: "yes", False: "no", None: ""}[row.met(after)]
        if before is None:
            cells = [row.value(after), met, row.own_us(after)]
        else:
            cells = [row.value(before), row.value(after), met, row.own_us(before)]
            cells.append(row.own_us(after))
        table.add_row(row.measure, row.target, *cells)
    console.print(table)
    console.print(
        "own µs: CPU microseconds per completion less the simulated model's own, "
        f"{model_us(after)} µs (its text, streamed in 48-character chunks to a sink that does "
        "nothing, measured alone in the same run); on Celery, the worker's CPU per slice (one "
        "completion) less the model's, beside the baseline task's whole CPU (task)"
    )


if __name__ == "__main__":
    main()
