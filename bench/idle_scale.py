"""A million idle threads in PostgreSQL: what each costs on disk, and what the rest pays.

    python bench/idle_scale.py [--threads 1000,1000000] [--turns 1] [--samples 400]
        [--rounds 20] [--batch 20000] [--out bench/results/full/idle_scale.json]

Needs the local PostgreSQL (a superuser role, for ``auto_explain``) and Redis. Each size of
``--threads`` gets a database ``dormant_bench_<hex>`` of its own, with its own Redis key
prefix and broker queues in db ``--redis-db`` and one Celery worker (``-P threads -c 8``);
all are dropped or deleted at the end, also on Ctrl-C or SIGTERM (``bench/celery_bench.py``).

An idle thread is a finished one: a template thread runs ``--turns`` turns of the reference
workload (user text, a ~1.2 KB completion calling a deferred tool, the delivered result, a
~1.2 KB completion), and the load **clones its rows** (thread, items, calls, finished inbox
rows, ran outbox rows) with ``INSERT ... SELECT generate_series``, ``--batch`` threads per
transaction, then vacuums and analyzes as autovacuum would (``bench/celery_scale.py``).
Once every size is loaded:

- wake latency: ``Client.deliver`` to the model call starting on the worker, for
  ``--samples`` fresh waiting threads per size, one delivery at a time, in ``--rounds``
  rounds that alternate between the sizes (the machine is shared: its load weighs on each
  size alike); p50 and p99;
- each worker's resident memory, after its deliveries;
- bytes on disk: ``pg_total_relation_size`` of each of dormant's tables (heap, TOAST and
  indexes), per table and per index. Bytes per idle thread is the difference between a size
  and the smallest divided by the threads between them (fixed costs, such as the pages of
  empty tables, cancel out); the total divided by the threads is shown beside it;
- at the largest size, the plan of every sweeper and claim query (``bench/sweep_plans.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from celery_bench import HERE, Bench, database
from celery_scale import add_idle_threads, make_template, worker_rss_bytes
from celery_throughput import deliver_latency, quantiles, waiting_threads
from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine, text
from sweep_plans import sweep_plans

from dormant.stores.sql.tables import metadata

console = Console(width=130)
PREFIX = "idle_"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1000,1000000", help="sizes measured, ascending")
    parser.add_argument("--turns", type=int, default=1, help="turns of the cloned thread")
    parser.add_argument("--samples", type=int, default=400, help="deliveries timed per size")
    parser.add_argument("--rounds", type=int, default=20, help="alternations between sizes")
    parser.add_argument("--batch", type=int, default=20_000, help="threads per transaction")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-host", default="redis://127.0.0.1:6379")
    parser.add_argument("--redis-db", type=int, default=12)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "full" / "idle_scale.json")
    args = parser.parse_args()
    if args.redis_db == 0:
        parser.error("the bench never uses Redis db 0")
    sizes = [int(n) for n in args.threads.split(",")]
    if sizes != sorted(sizes) or len(sizes) < 2:
        parser.error("--threads: two or more sizes, ascending")
    # Stopped with SIGTERM, still stop the workers, drop the databases, delete the keys.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, Any] = {
        "turns": args.turns,
        "samples": args.samples,
        "rounds": args.rounds,
        "sizes": {},
    }
    with ExitStack() as stack:
        benches = {}
        for size in sizes:
            database_url = stack.enter_context(database(args.postgres_url))
            redis_url = f"{args.redis_host}/{args.redis_db}"
            bench = Bench(bench_env(database_url, redis_url), redis_url)
            bench.log = HERE / "results" / "idle-scale-workers.log"
            stack.callback(bench.close)  # before its database is dropped
            benches[size] = bench
        run(benches, args, results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    report(results)
    console.print(f"raw figures: {args.out}")


def bench_env(database_url: str, redis_url: str) -> dict[str, str]:
    """One size's settings: its own database, key prefix and broker queues."""
    prefix = f"dormant_bench_{secrets.token_hex(4)}"
    return {
        "DORMANT_DATABASE_URL": database_url,
        "DORMANT_BROKER_URL": redis_url,
        "DORMANT_REDIS_URL": redis_url,
        "DORMANT_KEY_PREFIX": prefix,
        "DORMANT_BROKER_KEY_PREFIX": f"{prefix}:broker:",
        "DORMANT_SECRET_KEY": secrets.token_hex(16),
        "DORMANT_AGENTS": "celery_app",
    }


def run(benches: dict[int, Bench], args: Any, results: dict[str, Any]) -> None:
    """Load every size, then time deliveries alternating between the sizes, so that a
    machine whose load changes (it is shared) weighs on each size alike."""
    for size, bench in benches.items():
        say(f"{size:,} idle threads: a {args.turns}-turn template thread")
        make_template(bench.settings.database_url, turns=args.turns)
        grow(bench.engine, size, args.batch)
    calls = {}
    for size, bench in benches.items():
        bench.start_workers(1)
        bench.ready()
        calls[size] = waiting_threads(bench, "wake_", args.samples)
    timed: dict[int, list[float]] = {size: [] for size in benches}
    per_round = -(-args.samples // args.rounds)
    load_before = os.getloadavg()
    for round_ in range(args.rounds):
        order = list(benches) if round_ % 2 == 0 else list(reversed(benches))
        for size in order:
            mine = calls[size][round_ * per_round : (round_ + 1) * per_round]
            timed[size] += deliver_latency(benches[size], mine)
        say(f"  round {round_ + 1} of {args.rounds}: {sum(map(len, timed.values())):,} wakes")
    load_after = os.getloadavg()
    for size, bench in benches.items():
        bench.drain()
        results["sizes"][str(size)] = {
            "idle_threads": count_threads(bench.engine),
            "deliver": quantiles(timed[size]),
            "worker_rss_bytes": worker_rss_bytes(bench.workers[0].pid),
            "relations": relation_bytes(bench.engine),
            "load_average": [load_before, load_after],
        }
    say("the sweeper's and the claims' plans")
    largest = benches[max(benches)]
    results["plans"] = sweep_plans(largest.settings.database_url, f"{PREFIX}0", "chat")


def grow(engine: Engine, size: int, batch: int) -> None:
    """Clone the template until ``size`` threads are idle, printing progress."""
    have = count_threads(engine)
    if size <= have:
        return
    wanted = size - have
    started = time.monotonic()

    def progress(done: int) -> None:
        elapsed = time.monotonic() - started
        rate = done / elapsed
        say(
            f"  {have + done:,} of {size:,} threads, {rate:,.0f} threads/s, "
            f"{(wanted - done) / rate:,.0f} s to go"
        )

    say(f"cloning {wanted:,} idle threads, {batch:,} a transaction")
    add_idle_threads(engine, PREFIX, wanted, batch=batch, progress=progress)
    say(f"  loaded, vacuumed and analyzed in {time.monotonic() - started:,.0f} s")


def count_threads(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM threads")).scalar_one())


def relation_bytes(engine: Engine) -> dict[str, dict[str, int]]:
    """For each of dormant's tables: its total, heap, TOAST (with the free-space and
    visibility maps) and each index, in bytes."""
    query = text(
        "SELECT pg_total_relation_size(c.oid) AS total, pg_relation_size(c.oid) AS heap, "
        "pg_table_size(c.oid) - pg_relation_size(c.oid) AS toast FROM pg_class c "
        "WHERE c.oid = CAST(:t AS regclass)"
    )
    indexes = text(
        "SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid) FROM pg_index i "
        "WHERE i.indrelid = CAST(:t AS regclass) ORDER BY 1"
    )
    sizes = {}
    with engine.connect() as conn:
        for table in sorted(metadata.tables):
            row = conn.execute(query, {"t": table}).mappings().one()
            sizes[table] = dict(row) | {
                name: int(size) for name, size in conn.execute(indexes, {"t": table})
            }
    return sizes


def say(message: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}", highlight=False)


def per_thread(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Bytes per idle thread added since the first size, by relation, for each later size."""
    sizes = results["sizes"]
    first = sizes[min(sizes, key=int)]
    out: dict[str, dict[str, float]] = {}
    for size, figures in sizes.items():
        added = figures["idle_threads"] - first["idle_threads"]
        if added <= 0:
            continue
        grown: dict[str, float] = {}
        for table, parts in figures["relations"].items():
            for part, size_b in parts.items():
                before = first["relations"][table][part]
                name = table if part == "total" else f"{table} {part}"
                grown[name] = (size_b - before) / added
        out[size] = grown
    return out


def ratio_interval(
    base_ms: list[float], other_ms: list[float], percentile: int, resamples: int = 2000
) -> tuple[float, float]:
    """The 95 % bootstrap interval of ``other``'s percentile over ``base``'s: whether a
    difference is the idle threads' or the noise of a few hundred samples."""
    draw = random.Random(percentile)

    def resampled(samples: list[float]) -> float:
        again = draw.choices(samples, k=len(samples))
        return statistics.quantiles(again, n=100)[percentile - 1]

    ratios = sorted(resampled(other_ms) / resampled(base_ms) for _ in range(resamples))
    return ratios[resamples // 40], ratios[resamples - 1 - resamples // 40]


def report(results: dict[str, Any]) -> None:
    table = Table(title=f"idle threads in PostgreSQL ({results['turns']}-turn clones)")
    columns = ("idle threads", "bytes / thread", "wake p50 ms", "wake p99 ms", "worker RSS")
    for column in columns:
        table.add_column(column, justify="right")
    grown = per_thread(results)
    smallest = results["sizes"][min(results["sizes"], key=int)]["deliver"]["all_ms"]
    for size, figures in results["sizes"].items():
        on_disk = sum(parts["total"] for parts in figures["relations"].values())
        slope = sum(v for k, v in grown.get(size, {}).items() if " " not in k)
        wakes = figures["deliver"]
        shown = {q: f"{wakes[f'p{q}_ms']:.1f}" for q in (50, 99)}
        if size in grown:
            for q in shown:
                low, high = ratio_interval(smallest, wakes["all_ms"], q)
                shown[q] += f" ({low:.2f}-{high:.2f}x)"
        table.add_row(
            f"{figures['idle_threads']:,}",
            f"{on_disk / figures['idle_threads']:,.0f} all"
            + (f", {slope:,.0f} added" if size in grown else ""),
            shown[50],
            shown[99],
            f"{figures['worker_rss_bytes'] / 2**20:.0f} MiB",
        )
    console.print(table)
    console.print("(x: 95 % bootstrap interval of the ratio to the smallest size)")
    if grown:
        size = max(grown, key=int)
        parts = Table(title=f"bytes per idle thread added, up to {int(size):,}, by relation")
        parts.add_column("relation")
        parts.add_column("bytes / thread", justify="right")
        for name, value in sorted(grown[size].items(), key=lambda kv: -kv[1]):
            if abs(value) >= 1:
                parts.add_row(name, f"{value:,.0f}")
        console.print(parts)
    for name, plan in results.get("plans", {}).items():
        console.print(f"[bold]{name}[/bold]\n{plan}", highlight=False)


if __name__ == "__main__":
    main()
