"""CPU per slice with tracing off, against a no-instrumentation baseline, and with an SDK.

    python bench/tracing_overhead.py [--slices 2000] [--rounds 3] [--store memory,sqlite]
                                     [--out bench/results/tracing.json]

Each mode runs in a fresh interpreter, the modes interleaved for ``--rounds`` rounds (the
figure is the median), so their ratios come from the same run on the same machine:

- ``baseline``: ``Settings(tracing=False)`` and no OpenTelemetry imported: the hooks are
  calls on the no-op trace, what dormant paid before tracing existed (plus those calls);
- ``absent``: the default settings, OpenTelemetry never imported (``dormant[otel]`` not
  installed, or installed and unused): one ``sys.modules`` lookup a slice;
- ``api_only``: the API imported but no SDK configured: the provider check a slice;
- ``sdk``: an SDK tracer provider with a ``BatchSpanProcessor`` and an exporter that
  drops what it gets (dormant's spans and the SDK's own cost, not a network's).

A slice is one user message applied and one scripted completion committed, on the memory
store or a SQLite file (two transactions a slice, as in production). CPU is the process's
``time.process_time`` (the batch processor's thread included) over ``--slices`` slices.

These slices are far cheaper than a deployed one (no broker, no Redis, no model's HTTP), so
the SDK's added microseconds are also set against a Celery slice's CPU as
``bench/celery_throughput.py`` last measured it (``bench/results/celery.json``), when that
file exists.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODES = ("baseline", "absent", "api_only", "sdk")

_CHILD = """
import json, sys, time
mode, store_kind, slices, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if mode == "api_only":
    import opentelemetry.trace
if mode == "sdk":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)

from dormant.agents import Agent, AgentRegistry
from dormant.messages import UserMessage
from dormant.models import ScriptedModel, reply
from dormant.runtime.slice import Idle, SliceDeps, run_slice
from dormant.settings import Settings
from dormant.stores.base import NewThread, Priority
from dormant.stores.memory.store import MemoryStore
from dormant.stores.memory.sync import MemoryDedup, MemoryLease

class Quiet:
    def publish(self, event): pass
    def dispatch(self, row): pass
    def wake(self, thread_id, priority): return True

if store_kind == "sqlite":
    from dormant.stores.sql.store import SQLStore, upgrade
    url = "sqlite:///" + path
    upgrade(url)
    store = SQLStore(url)
else:
    store = MemoryStore()
agent = Agent("bench", model=ScriptedModel(lambda items: reply("a short answer")))
settings = Settings(tracing=mode != "baseline")
quiet = Quiet()
agents = AgentRegistry([agent])
deps = SliceDeps(store, MemoryLease(), MemoryDedup(), quiet, quiet, agents, settings)
threads = [f"t{i}" for i in range(50)]
for t in threads:
    store.create_thread(NewThread(id=t, agent="bench"))

def one(i):
    t = threads[i % len(threads)]
    store.enqueue(t, f"m{i}", UserMessage(text="hello"), Priority.INTERACTIVE)
    assert isinstance(run_slice(t, deps), Idle)

for i in range(200):  # warm up: caches, the SDK's first spans
    one(i)
started = time.process_time()
for i in range(200, 200 + slices):
    one(i)
spent = time.process_time() - started
if mode == "sdk":
    provider.shutdown()
print(json.dumps({"us_per_slice": spent / slices * 1e6,
                  "otel_imported": "opentelemetry.trace" in sys.modules}))
"""


def run_mode(mode: str, store: str, slices: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-c", _CHILD, mode, store, str(slices), f"{tmp}/bench.db"]
        done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _celery_slice_us() -> float | None:
    """A Celery worker's CPU per slice at concurrency 1, from the last Celery bench."""
    path = HERE / "results" / "celery.json"
    try:
        return float(json.loads(path.read_text())["throughput"]["1"]["slice_cpu_us"])
    except (OSError, KeyError, ValueError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slices", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", default="memory,sqlite")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "tracing.json")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    for store in args.store.split(","):
        samples: dict[str, list[float]] = {mode: [] for mode in MODES}
        imported: dict[str, bool] = {}
        for _ in range(args.rounds):
            for mode in MODES:
                found = run_mode(mode, store, args.slices)
                samples[mode].append(found["us_per_slice"])
                imported[mode] = found["otel_imported"]
        medians = {mode: statistics.median(values) for mode, values in samples.items()}
        base = medians["baseline"]
        results[store] = {
            "us_per_slice": medians,
            "ratio_to_baseline": {mode: medians[mode] / base for mode in MODES},
            "opentelemetry_imported": imported,
            "samples": samples,
        }
        print(f"{store}: CPU per slice (median of {args.rounds} runs of {args.slices} slices)")
        for mode in MODES:
            print(
                f"  {mode:9} {medians[mode]:8.1f} us  x{medians[mode] / base:.3f}"
                f"  opentelemetry imported: {imported[mode]}"
            )
    celery_us = _celery_slice_us()
    if celery_us is not None:
        for store, found in results.items():
            added = found["us_per_slice"]["sdk"] - found["us_per_slice"]["baseline"]
            found["sdk_added_share_of_celery_slice"] = added / celery_us
            print(
                f"{store}: the SDK adds {added:.0f} us a slice, {added / celery_us:.1%} of a "
                f"Celery slice's {celery_us:.0f} us of CPU (bench/results/celery.json)"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
