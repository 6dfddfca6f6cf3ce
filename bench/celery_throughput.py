"""dormant on Celery, end to end through ``Client``, beside plain Celery tasks in the same run.

    python bench/celery_throughput.py [--quick] [--out bench/results/celery.json]
        [--phases throughput,latency,waiting,idle] [--wait-agents N] [--wait-s S]
        [--worker-cli dormant|celery]

Needs the local PostgreSQL and Redis. Creates a database ``dormant_bench_<hex>`` (dropped
at the end) and uses Redis db ``--redis-db`` (12; never 0) under a fresh key prefix and
broker prefix (deleted at the end). Workers are real Celery worker processes (``-P
threads``) on ``bench/celery_app.py``, started as ``dormant worker`` starts one
(``bench/celery_worker.py``) or, with ``--worker-cli celery``, by ``celery -A celery_app
worker``; the harness is ``bench/celery_bench.py``. Every dormant figure is counted when the
commit is visible in PostgreSQL (the assistant rows), never inside the model call.

1. Throughput, 1 and 2 worker processes (``-c 8`` each): no-op tasks/s, then dormant
   slices/s over threads started with ``Client.launch`` (each one streamed completion),
   then over one ``Client.send`` to each of them; and how many ``send_task`` and
   ``Client.send`` calls a single sender makes a second while the workers run.
2. Wake latency on 1 worker: ``Client.deliver`` to the model call starting, against
   ``send_task`` of a no-op to it starting; alone (low load) and under a background load
   at half the throughput measured in 1 (``LOADED_SHARE``; it was 80 % until December 2026,
   which overloaded both queues on 2 cores once the baseline was measured after the
   worker's start, and the run never ended).
3. Waiting is free: N agents each waiting W s on a tool, 1 worker, 8 slots: a blocking
   Celery task per agent (completion, sleep W, completion) against dormant's deferred tool
   whose result the driver delivers W s after the call.
4. Idle scale: worker RSS and wake latency with few idle threads in PostgreSQL, then
   with many (copies of a finished 20-turn thread, inserted in bulk).
5. Worker start: ``Popen`` to its first no-op task done, wall and the worker's CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery_bench import HERE, Bench, database
from celery_scale import add_idle_threads, make_template, worker_rss_bytes
from rich.console import Console
from rich.table import Table
from sqlalchemy import text
from workload import model_cpu_us

console = Console(width=130)
LOADED_SHARE = 0.5
"""The latency phase's background load: this share of each one's measured throughput."""


def warm_up(bench: Bench) -> dict[str, float]:
    """Start-up: from Popen to the first no-op done, wall time and the worker's CPU."""
    bench.redis.set(bench.key("done"), 0)
    started = time.monotonic()
    bench.start_workers(1)
    bench.noop()
    bench.wait(bench.done, 1, timeout_s=120)
    wall = time.monotonic() - started
    return {"worker_ready_wall_s": wall, "worker_ready_cpu_s": bench.workers_cpu_s()}


def throughput(bench: Bench, tag: str, count: int) -> dict[str, float]:
    """No-op tasks/s, then slices/s of ``count`` launched threads, then of one ``Client.send``
    to each of them, on the running workers. Each loop is also timed alone: how many
    ``send_task`` and ``Client.send`` calls one sender makes a second while the workers run,
    and the workers' CPU per no-op and per slice from ``send`` (one completion each)."""
    bench.redis.set(bench.key("done"), 0)
    cpu_s = bench.workers_cpu_s()
    started = time.monotonic()
    for _ in range(count):
        bench.noop()
    noop_sender_per_s = count / (time.monotonic() - started)
    noop_per_s = count / (bench.wait(bench.done, count) - started)
    noop_cpu_us = (bench.workers_cpu_s() - cpu_s) / count * 1e6
    prefix = f"{tag}_"
    started = time.monotonic()
    for i in range(count):
        bench.client.launch("chat", f"hello {i}", thread_id=f"{prefix}{i}")
    slices_per_s = count / (bench.wait(lambda: bench.committed(prefix), count) - started)
    cpu_s = bench.workers_cpu_s()
    started = time.monotonic()
    for i in range(count):
        bench.client.send(f"{prefix}{i}", f"and again {i}")
    send_sender_per_s = count / (time.monotonic() - started)
    sent_slices_at = bench.wait(lambda: bench.committed(prefix), 2 * count)
    send_slices_per_s = count / (sent_slices_at - started)
    slice_cpu_us = (bench.workers_cpu_s() - cpu_s) / count * 1e6
    return {
        "noop_cpu_us": noop_cpu_us,
        "slice_cpu_us": slice_cpu_us,
        "noop_per_s": noop_per_s,
        "slices_per_s": slices_per_s,
        "ratio": slices_per_s / noop_per_s,
        "send_slices_per_s": send_slices_per_s,
        "send_ratio": send_slices_per_s / noop_per_s,
        "noop_sender_per_s": noop_sender_per_s,
        "send_sender_per_s": send_sender_per_s,
        "sender_ratio": send_sender_per_s / noop_sender_per_s,
    }


def quantiles(samples_ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples_ms, n=100)
    return {"p50_ms": q[49], "p99_ms": q[98], "samples": len(samples_ms), "all_ms": samples_ms}


def waiting_threads(bench: Bench, tag: str, count: int) -> list[dict[str, Any]]:
    """Launch ``count`` waiter threads and return their pending calls once all are made."""
    calls_key = bench.key("calls")
    for i in range(count):
        bench.client.launch("waiter", f"build {i}", thread_id=f"{tag}_{i}")
    bench.wait(lambda: bench.redis.llen(calls_key), count)
    raw = bench.redis.lrange(calls_key, 0, -1)
    bench.redis.delete(calls_key)
    return [json.loads(r) for r in raw]


def deliver_latency(bench: Bench, calls: list[dict[str, Any]]) -> list[float]:
    """One at a time: ``deliver`` returning ... the model call starting, in ms."""
    samples = []
    for call in calls:
        thread_id = call["thread_id"]
        bench.redis.hdel(bench.key("started"), thread_id)
        sent = time.time()
        bench.client.deliver(thread_id, call["call_id"], "build green")
        while (started := bench.redis.hget(bench.key("started"), thread_id)) is None:
            bench.check_workers()
            time.sleep(0.0005)
        samples.append((float(started) - sent) * 1000)
    return samples


def noop_latency(bench: Bench, count: int) -> list[float]:
    samples = []
    for n in range(count):
        sample = f"s{n}"
        sent = time.time()
        bench.noop(sample)
        while (started := bench.redis.hget(bench.key("noop_started"), sample)) is None:
            bench.check_workers()
            time.sleep(0.0005)
        samples.append((float(started) - sent) * 1000)
    bench.redis.delete(bench.key("noop_started"))
    return samples


@contextmanager
def background_load(rate_per_s: float, send: Callable[[int], None]) -> Iterator[None]:
    """Call ``send(i)`` ``rate_per_s`` times a second on a thread until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        started, n = time.monotonic(), 0
        while not stop.is_set():
            due = started + n / rate_per_s
            if (ahead := due - time.monotonic()) > 0:
                stop.wait(ahead)
                continue
            send(n)
            n += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def latency(bench: Bench, samples: int, slices_per_s: float, noop_per_s: float) -> dict[str, Any]:
    calls = waiting_threads(bench, "lat", samples * 2)
    low: dict[str, Any] = {}
    cpu_s = bench.workers_cpu_s()
    low["deliver"] = quantiles(deliver_latency(bench, calls[:samples]))
    low["deliver_cpu_us"] = (bench.workers_cpu_s() - cpu_s) / samples * 1e6
    cpu_s = bench.workers_cpu_s()
    low["noop"] = quantiles(noop_latency(bench, samples))
    low["noop_cpu_us"] = (bench.workers_cpu_s() - cpu_s) / samples * 1e6
    with background_load(LOADED_SHARE * slices_per_s, lambda i: bench.client.launch("chat", "hi")):
        time.sleep(1)
        busy_deliver = quantiles(deliver_latency(bench, calls[samples:]))
    bench.drain()
    with background_load(LOADED_SHARE * noop_per_s, lambda i: bench.noop()):
        time.sleep(1)
        busy_noop = quantiles(noop_latency(bench, samples))
    bench.drain()
    return {"low_load": low, "loaded": {"deliver": busy_deliver, "noop": busy_noop}}


def waiting_is_free(bench: Bench, agents: int, wait_s: float) -> dict[str, float]:
    """Blocking Celery loop vs dormant's deferred tool: wall time for ``agents`` agents, and
    the worker's CPU per completion (two an agent) in each."""
    bench.redis.set(bench.key("done"), 0)
    cpu_s = bench.workers_cpu_s()
    started = time.monotonic()
    for i in range(agents):
        bench._app().send_task("bench.blocking_agent", args=[i, wait_s], queue="dormant.tools")
    blocking_s = bench.wait(bench.done, agents, timeout_s=agents * wait_s + 600) - started
    blocking_cpu_us = (bench.workers_cpu_s() - cpu_s) / (2 * agents) * 1e6

    calls_key = bench.key("calls")
    cpu_s = bench.workers_cpu_s()
    started = time.monotonic()
    for i in range(agents):
        bench.client.launch("waiter", f"build {i}", thread_id=f"wait_{i}")
    delivered = 0
    while delivered < agents:
        bench.check_workers()
        raw = bench.redis.lpop(calls_key)
        if raw is None:
            time.sleep(0.01)
            continue
        call = json.loads(raw)
        if (ahead := call["at"] + wait_s - time.time()) > 0:
            time.sleep(ahead)
        bench.client.deliver(call["thread_id"], call["call_id"], "build green")
        delivered += 1
    dormant_s = bench.wait(lambda: bench.committed("wait_"), agents * 2) - started
    return {
        "blocking_cpu_us": blocking_cpu_us,
        "dormant_cpu_us": (bench.workers_cpu_s() - cpu_s) / (2 * agents) * 1e6,
        "blocking_wall_s": blocking_s,
        "dormant_wall_s": dormant_s,
        "ratio": blocking_s / dormant_s,
    }


def idle_scale(bench: Bench, few: int, many: int, samples: int) -> dict[str, Any]:
    figures = {}
    for idle in (few, many):
        add_idle_threads(bench.engine, "scale_", idle - bench_idle_count(bench))
        calls = waiting_threads(bench, f"idle{idle}", samples)
        figures[str(idle)] = {
            "idle_threads": bench_idle_count(bench),
            "deliver": quantiles(deliver_latency(bench, calls)),
            "worker_rss_bytes": worker_rss_bytes(bench.workers[0].pid),
        }
    return figures


def bench_idle_count(bench: Bench) -> int:
    with bench.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM threads")).scalar_one())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the sizes of `make bench`")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-host", default="redis://127.0.0.1:6379")
    parser.add_argument("--redis-db", type=int, default=12)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "celery.json")
    parser.add_argument("--phases", default="throughput,latency,waiting,idle")
    parser.add_argument("--wait-agents", type=int, help="override the size's agents waiting")
    parser.add_argument("--wait-s", type=float, help="override the size's wait per agent")
    parser.add_argument(
        "--worker-cli",
        choices=("dormant", "celery"),
        default="dormant",
        help="start workers as `dormant worker` does, or through `celery -A celery_app worker`",
    )
    args = parser.parse_args()
    if args.redis_db == 0:
        parser.error("the bench never uses Redis db 0")
    # Stopped with SIGTERM, still stop the workers, drop the database, delete the keys.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = (
        {"tasks": 200, "samples": 30, "wait_agents": 40, "wait_s": 1.0, "idle": (1000, 5000)}
        if args.quick
        else {
            "tasks": 2000,
            "samples": 200,
            "wait_agents": 200,
            "wait_s": 5.0,
            "idle": (1000, 100_000),
        }
    )
    if args.wait_agents is not None:
        sizes["wait_agents"] = args.wait_agents
    if args.wait_s is not None:
        sizes["wait_s"] = args.wait_s
    sizes["phases"] = args.phases.split(",")
    redis_url = f"{args.redis_host}/{args.redis_db}"
    prefix = f"dormant_bench_{secrets.token_hex(4)}"
    results: dict[str, Any] = {
        "sizes": sizes,
        "cpus": os.cpu_count(),
        "worker_cli": args.worker_cli,
        "model_cpu_us_per_completion": model_cpu_us(),
    }
    with database(args.postgres_url) as database_url:
        env = {
            "DORMANT_DATABASE_URL": database_url,
            "DORMANT_BROKER_URL": redis_url,
            "DORMANT_REDIS_URL": redis_url,
            "DORMANT_KEY_PREFIX": prefix,
            "DORMANT_BROKER_KEY_PREFIX": f"{prefix}:broker:",
            "DORMANT_SECRET_KEY": secrets.token_hex(16),
            "DORMANT_AGENTS": "celery_app",
        }
        bench = Bench(env, redis_url, args.worker_cli)
        try:
            run(bench, sizes, results)
        finally:
            bench.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    console.print(f"raw figures: {args.out}")


def run(bench: Bench, sizes: dict[str, Any], results: dict[str, Any]) -> None:
    phases = sizes["phases"]
    if "latency" in phases and "throughput" not in phases:
        raise SystemExit(
            "the latency phase loads the worker at a rate the throughput phase measures"
        )
    with console.status("worker start") as status:
        results["start"] = warm_up(bench)
        if "throughput" in phases:
            results["throughput"] = {}
            for workers in (1, 2):
                status.update(f"throughput, {workers} worker(s)")
                if len(bench.workers) < workers:
                    bench.start_workers(workers - len(bench.workers))
                bench.ready(20 * workers)
                figures = throughput(bench, f"tp{workers}", sizes["tasks"])
                results["throughput"][str(workers)] = figures
            fresh_worker(bench)
        if "latency" in phases:
            one = results["throughput"]["1"]
            status.update("wake latency")
            results["latency"] = latency(
                bench, sizes["samples"], one["slices_per_s"], one["noop_per_s"]
            )
            fresh_worker(bench)
        if "waiting" in phases:
            status.update(f"waiting is free ({sizes['wait_agents']} agents, {sizes['wait_s']} s)")
            results["waiting"] = waiting_is_free(bench, sizes["wait_agents"], sizes["wait_s"])
            bench.drain()
        if "idle" in phases:
            status.update("idle scale: a 20-turn template thread")
            make_template(bench.settings.database_url)
            status.update("idle scale")
            few, many = sizes["idle"]
            results["idle_scale"] = idle_scale(bench, few, many, sizes["samples"])
    report(results)


def fresh_worker(bench: Bench) -> None:
    """One new worker, ready, with nothing queued: no phase inherits another's backlog."""
    bench.drain()
    bench.stop_workers()
    bench.start_workers(1)
    bench.ready()


def report(results: dict[str, Any]) -> None:
    """The figures, and each ratio to its baseline from this run; where the worker's CPU was
    read, its microseconds per slice and per no-op (a slice is one completion; the simulated
    model's own share of it is printed under the table)."""
    table = Table(title="dormant on Celery, against plain Celery tasks in the same run")
    for column in ("measure", "dormant", "baseline", "ratio", "worker CPU µs"):
        table.add_column(column, justify="right")
    for workers, tp in results.get("throughput", {}).items():
        table.add_row(
            f"tasks/s, {workers} worker(s), from launch",
            f"{tp['slices_per_s']:.1f} slices",
            f"{tp['noop_per_s']:.1f} no-ops",
            f"{tp['ratio']:.2f}",
            "",
        )
        table.add_row(
            f"tasks/s, {workers} worker(s), from send",
            f"{tp['send_slices_per_s']:.1f} slices",
            f"{tp['noop_per_s']:.1f} no-ops",
            f"{tp['send_ratio']:.2f}",
            f"{tp['slice_cpu_us']:,.0f} vs {tp['noop_cpu_us']:,.0f}",
        )
        table.add_row(
            f"one sender's calls/s, {workers} worker(s)",
            f"{tp['send_sender_per_s']:.0f} Client.send",
            f"{tp['noop_sender_per_s']:.0f} send_task",
            f"{tp['sender_ratio']:.2f}",
            "",
        )
    for load, figures in results.get("latency", {}).items():
        d, n = figures["deliver"], figures["noop"]
        cpu = ""
        if "deliver_cpu_us" in figures:
            cpu = f"{figures['deliver_cpu_us']:,.0f} vs {figures['noop_cpu_us']:,.0f}"
        for q in ("p50_ms", "p99_ms"):
            table.add_row(
                f"wake {q[:3]} ms, {load}",
                f"{d[q]:.1f}",
                f"{n[q]:.1f}",
                f"{d[q] / n[q]:.2f}",
                cpu if q == "p50_ms" else "",
            )
    if w := results.get("waiting"):
        table.add_row(
            "waiting is free: wall s",
            f"{w['dormant_wall_s']:.1f}",
            f"{w['blocking_wall_s']:.1f} blocking",
            f"{w['ratio']:.1f}",
            f"{w['dormant_cpu_us']:,.0f} vs {w['blocking_cpu_us']:,.0f} a completion",
        )
    for figures in results.get("idle_scale", {}).values():
        table.add_row(
            f"{figures['idle_threads']:,} idle threads",
            f"wake p50 {figures['deliver']['p50_ms']:.0f} ms",
            f"worker RSS {figures['worker_rss_bytes'] / 2**20:.0f} MiB",
            "",
            "",
        )
    start = results["start"]
    table.add_row(
        "worker start to first task",
        f"{start['worker_ready_wall_s']:.1f} s wall",
        f"{start['worker_ready_cpu_s']:.1f} s CPU",
        "",
        "",
    )
    console.print(table)
    console.print(
        f"the simulated model's own CPU: {results['model_cpu_us_per_completion']:.0f} µs a "
        "completion (its text, streamed in 48-character chunks to a sink that does nothing)"
    )


if __name__ == "__main__":
    main()
