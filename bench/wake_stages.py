"""Where a Celery wake's milliseconds go: ``Client.deliver`` to the model call starting, by
stage, beside a no-op's ``send_task`` to its start (the wake latency of
``bench/celery_throughput.py``, taken apart).

    python bench/wake_stages.py [--samples 200] [--out bench/results/wake_stages.json]

One worker (``bench/celery_worker.py``, 8 threads, ``DORMANT_BENCH_PROBE=1``), no other
load: ``--samples`` waiter threads each get one ``deliver`` (one at a time, as the latency
phase does), then as many no-ops are sent. The stamps are ``bench/wake_probe.py``'s; the
table is the median of each stage's milliseconds, and of the whole interval (the median of
the sums, not the sum of the medians).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

from celery_bench import HERE, Bench, database
from celery_throughput import waiting_threads
from rich.console import Console
from rich.table import Table
from wake_probe import CLIENT, install_client_probes

console = Console(width=120)

SLICE_STAGES = (
    ("deliver: checks before the store", "sent", "enqueue"),
    ("deliver: the INSERT and its commit", "enqueue", "enqueued"),
    ("wake: the task message built", "enqueued", "put"),
    ("wake: the script sent, to the worker's BRPOP read", "put", "read"),
    ("read to task_received (decode, request)", "read", "received"),
    ("received to task start (events, pool)", "received", "prerun"),
    ("task start to run_slice", "prerun", "run_slice"),
    ("run_slice to the lease script", "run_slice", "lease"),
    ("the lease script", "lease", "leased"),
    ("lease to load (keeper, slice set-up)", "leased", "load"),
    ("the load", "load", "loaded"),
    ("load to conversation (apply the inbox)", "loaded", "converse"),
    ("conversation to admission (meter, request)", "converse", "admission"),
    ("admission to the model call", "admission", "model"),
)
NOOP_STAGES = (
    ("send_task: the task message built", "sent", "put"),
    ("the LPUSH sent, to the worker's BRPOP read", "put", "read"),
    ("read to task_received (decode, request)", "read", "received"),
    ("received to task start (events, pool)", "received", "prerun"),
    ("task start to its body", "prerun", "model"),
)


def stamped(bench: Bench, key: str, end_hash: str) -> dict[str, float]:
    """The worker's stamps for ``key`` (sent after its task), with its end stamp."""
    deadline = time.monotonic() + 30
    while (raw := bench.redis.hget(bench.key("stages"), key)) is None:
        bench.check_workers()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no stamps from the worker for {key}")
        time.sleep(0.001)
    stamps = json.loads(raw)
    stamps["model"] = float(bench.redis.hget(bench.key(end_hash), key) or "nan")
    bench.redis.hdel(bench.key("stages"), key)
    return dict(stamps)


def slice_samples(bench: Bench, count: int) -> list[dict[str, float]]:
    calls = waiting_threads(bench, "stg", count)
    bench.redis.delete(bench.key("stages"))
    samples = []
    for call in calls:
        thread_id = call["thread_id"]
        bench.redis.hdel(bench.key("started"), thread_id)
        CLIENT.clear()
        CLIENT["sent"] = time.time()
        bench.client.deliver(thread_id, call["call_id"], "build green")
        client = dict(CLIENT)
        while bench.redis.hget(bench.key("started"), thread_id) is None:
            bench.check_workers()
            time.sleep(0.0005)
        samples.append({**stamped(bench, thread_id, "started"), **client})
    return samples


def noop_samples(bench: Bench, count: int) -> list[dict[str, float]]:
    samples = []
    for n in range(count):
        sample = f"n{n}"
        CLIENT.clear()
        CLIENT["sent"] = time.time()
        bench.noop(sample)
        client = dict(CLIENT)
        while bench.redis.hget(bench.key("noop_started"), sample) is None:
            bench.check_workers()
            time.sleep(0.0005)
        samples.append({**stamped(bench, sample, "noop_started"), **client})
    return samples


def medians(samples: list[dict[str, float]], stages: Any) -> dict[str, float]:
    """The median of each stage, over the samples with every stamp (a second task of the
    same thread received while the first ran replaces its stamps: rare, and left out)."""
    names = {name for _, a, b in stages for name in (a, b)}
    samples = [s for s in samples if names <= s.keys()]
    figures = {
        label: statistics.median((s[b] - s[a]) * 1000 for s in samples) for label, a, b in stages
    }
    figures["the whole interval"] = statistics.median(
        (s["model"] - s["sent"]) * 1000 for s in samples
    )
    figures["samples with every stamp"] = len(samples)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "wake_stages.json")
    args = parser.parse_args()
    prefix = f"dormant_bench_{secrets.token_hex(4)}"
    with database(args.postgres_url) as database_url:
        env = {
            "DORMANT_DATABASE_URL": database_url,
            "DORMANT_BROKER_URL": args.redis_url,
            "DORMANT_REDIS_URL": args.redis_url,
            "DORMANT_KEY_PREFIX": prefix,
            "DORMANT_BROKER_KEY_PREFIX": f"{prefix}:broker:",
            "DORMANT_SECRET_KEY": secrets.token_hex(16),
            "DORMANT_AGENTS": "celery_app",
            "DORMANT_BENCH_PROBE": "1",
        }
        bench = Bench(env, args.redis_url)
        install_client_probes(bench.client.store)
        try:
            bench.start_workers(1)
            bench.ready()
            slices = slice_samples(bench, args.samples)
            noops = noop_samples(bench, args.samples)
        finally:
            bench.close()
    results = {
        "samples": args.samples,
        "load_average": os.getloadavg(),
        "slice": medians(slices, SLICE_STAGES),
        "noop": medians(noops, NOOP_STAGES),
        "raw": {"slice": slices, "noop": noops},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    for name in ("slice", "noop"):
        table = Table(title=f"{name}: median ms a stage, {args.samples} samples")
        table.add_column("stage")
        table.add_column("p50 ms", justify="right")
        for label, value in results[name].items():
            table.add_row(label, f"{value:.3f}" if isinstance(value, float) else str(value))
        console.print(table)
    console.print(f"load average {results['load_average']}; raw stamps: {args.out}")


if __name__ == "__main__":
    main()
