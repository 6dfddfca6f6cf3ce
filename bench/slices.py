"""Slices per second through LocalSystem on the memory store, against bare completions.

    python bench/slices.py [--threads N] [--turns T] [--workers W]

Baseline, in the same process: the same SimulatedModel completing the same number of
turns over a growing history with nothing around it. The ratio (runtime / baseline) is
the figure: how much of the model's own speed the runtime keeps. Also prints the stored
bytes per idle agent (memory store, serialized) and the Python heap per idle agent.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

from dormant import Agent, LocalSystem
from dormant.messages import AssistantTurn, Item, UserText
from dormant.models import SimulatedModel
from dormant.models.base import ModelRequest
from dormant.stores.memory import MemoryStore


def baseline(threads: int, turns: int) -> float:
    """Completions per second of the bare model over the same histories."""
    model = SimulatedModel()
    started = time.perf_counter()
    for t in range(threads):
        items: list[Item] = []
        for n in range(turns):
            items.append(UserText(text=f"message {n} for thread {t}"))
            request = ModelRequest(f"t{t}", "", tuple(items), ())
            items.append(AssistantTurn(text=model.complete(request, lambda _chunk: None).text))
    return threads * turns / (time.perf_counter() - started)


def runtime(threads: int, turns: int, workers: int, trace: bool) -> tuple[float, int, int]:
    """(slices per second, stored bytes per idle agent, heap bytes per idle agent or 0).

    With ``trace`` the Python heap is measured with tracemalloc, which slows everything:
    the timed figure comes from a run without it.
    """
    store = MemoryStore()
    agent = Agent("bench", model=SimulatedModel())
    gc.collect()
    if trace:
        tracemalloc.start()
    heap_before = tracemalloc.get_traced_memory()[0]
    with LocalSystem([agent], store=store, workers=workers) as system:
        started = time.perf_counter()
        ids = [system.launch("bench", f"message 0 for thread {t}") for t in range(threads)]
        system.run_until_idle(timeout_s=600)
        for n in range(1, turns):
            for thread_id in ids:
                system.send(thread_id, f"message {n} for thread {thread_id}")
            system.run_until_idle(timeout_s=600)
            if not trace:
                print(f"  turn {n + 1}/{turns}: {system.slices_run} slices", flush=True)
        elapsed = time.perf_counter() - started
        slices = system.slices_run
        stored = sum(store.stored_bytes(thread_id) for thread_id in ids) // threads
    gc.collect()
    heap = (tracemalloc.get_traced_memory()[0] - heap_before) // threads if trace else 0
    tracemalloc.stop()
    return slices / elapsed, stored, heap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=500)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    print(f"{args.threads} agents x {args.turns} turns, SimulatedModel (1,200-char completions)")
    base = baseline(args.threads, args.turns)
    print(f"baseline: {base:,.0f} bare completions/s")
    rate, stored, _ = runtime(args.threads, args.turns, args.workers, trace=False)
    print(f"LocalSystem (memory store, {args.workers} workers): {rate:,.0f} slices/s")
    print(f"ratio runtime/baseline: {rate / base:.3f}")
    print(f"stored bytes per idle agent: {stored:,}")
    _, _, heap = runtime(args.threads, args.turns, args.workers, trace=True)
    print(f"python heap per idle agent (tracemalloc, after close): {heap:,} bytes")


if __name__ == "__main__":
    main()
