"""PNG plots of the bench results (matplotlib, run in ``bench/.venv-plot``).

    bench/.venv-plot/bin/python bench/plots.py [--results bench/results] [--out docs/bench]

Reads ``reference.json`` and ``celery.json``; writes ``memory.png`` (RSS over idle agents),
``throughput.png`` (completions per CPU-second by wave) and ``latency.png`` (wake-up
latency CDF, dormant ``deliver`` against a no-op task, at low load and near saturation).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent


def memory(reference: dict[str, Any], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name, result in reference["results"].items():
        if not result["compression_in_band"]:
            continue
        xs = [p["agents"] for p in result["rss"]]
        ys = [p["rss_bytes"] / 2**20 for p in result["rss"]]
        per = result["rss_per_idle_agent_bytes"] / 1024
        ax.plot(xs, ys, marker="o", label=f"{name} ({per:,.0f} KB/agent)")
    ax.set_xlabel("idle agents (20 turns each)")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_title("Resident memory over idle agents")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=110)
    plt.close(fig)


def throughput(reference: dict[str, Any], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name, result in reference["results"].items():
        xs, ys, total = [], [], 0
        for wave in result["waves"]:
            total += wave["agents"]
            xs.append(total)
            ys.append(wave["per_cpu_s"])
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xlabel("agents in the process after the wave")
    ax.set_ylabel("completions per CPU-second (the wave)")
    ax.set_title("Throughput over agents")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)


def latency(celery: dict[str, Any], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for load in celery["latency"]:  # low_load, then the loaded run ("near_saturation" before)
        style = "-" if load == "low_load" else "--"
        for what, color in (("deliver", "tab:blue"), ("noop", "tab:gray")):
            samples = sorted(celery["latency"][load][what]["all_ms"])
            ys = [(i + 1) / len(samples) for i in range(len(samples))]
            label = f"{'dormant deliver' if what == 'deliver' else 'no-op task'}, {load}"
            ax.step(samples, ys, style, color=color, where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("wake-up latency (ms): send to start")
    ax.set_ylabel("fraction of samples")
    ax.set_title("Wake-up latency, 1 Celery worker")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    reference_path = args.results / "reference.json"
    if reference_path.exists():
        reference = json.loads(reference_path.read_text())
        memory(reference, args.out)
        throughput(reference, args.out)
    celery_path = args.results / "celery.json"
    if celery_path.exists() and "latency" in json.loads(celery_path.read_text()):
        latency(json.loads(celery_path.read_text()), args.out)
    print(f"plots in {args.out}")


if __name__ == "__main__":
    main()
