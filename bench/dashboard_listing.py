"""How fast the dashboard's thread list is over many threads: one page of each filter.

    .venv/bin/python bench/dashboard_listing.py --threads 100000 [--sqlite]

Fills a fresh database (a PostgreSQL one of its own, or a SQLite file) with ``--threads``
threads over five agents, most of them closed, a few stalled, created over 30 days, then
times ``Store.threads`` (what the list page runs) for the first page, a page deep in the
keyset, and each filter, and prints each query's plan (PostgreSQL: ``EXPLAIN ANALYZE``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dormant.stores.base import ThreadStatus  # noqa: E402
from dormant.stores.sql.store import SQLStore, upgrade  # noqa: E402
from tests.databases import temporary_database  # noqa: E402

AGENTS = ["triage", "billing", "writer", "release", "support"]
STATUSES = [("closed", 0.80), ("idle", 0.15), ("waiting", 0.0495), ("stalled", 0.0005)]


def fill(store: SQLStore, count: int) -> None:
    rng = random.Random(7)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    table = store._schema.threads
    names, weights = zip(*STATUSES, strict=True)
    batch: list[dict[str, Any]] = []
    with store._engine.begin() as conn:
        for n in range(count):
            created = start + timedelta(seconds=rng.uniform(0, 30 * 86400))
            thread_id = f"thr_{n:08x}{rng.getrandbits(32):08x}"
            batch.append(
                {
                    "id": thread_id,
                    "agent": rng.choice(AGENTS),
                    "root_id": thread_id,
                    "status": rng.choices(names, weights)[0],
                    "version": 3,
                    "metadata": {},
                    "usage": {},
                    "created_at": created,
                    "updated_at": created + timedelta(minutes=5),
                }
            )
            if len(batch) == 5000:
                conn.execute(insert(table), batch)
                batch = []
        if batch:
            conn.execute(insert(table), batch)
        if store._engine.dialect.name == "postgresql":
            conn.execute(text(f"ANALYZE {table.name}"))
        else:
            conn.execute(text("ANALYZE"))


def timed(fn: Any, runs: int = 7) -> float:
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def measure(store: SQLStore) -> dict[str, float]:
    first = store.threads(limit=51)
    deep = store.threads(limit=1, before=None)
    for _ in range(20):  # 20 pages of 50 in: a keyset far from the start
        page = store.threads(limit=50, before=(deep[-1].created_at, deep[-1].id))
        deep = page
    cursor = (deep[-1].created_at, deep[-1].id)
    cases = {
        "first page": lambda: store.threads(limit=51),
        "page 21 (keyset)": lambda: store.threads(limit=51, before=cursor),
        "status=stalled": lambda: store.threads(ThreadStatus.STALLED, 51),
        "status=waiting": lambda: store.threads(ThreadStatus.WAITING, 51),
        "agent=billing": lambda: store.threads(limit=51, agent="billing"),
        "stalled + billing": lambda: store.threads(ThreadStatus.STALLED, 51, agent="billing"),
        "stalled, page 2": lambda: store.threads(
            ThreadStatus.STALLED, 51, before=(first[0].created_at, first[0].id)
        ),
    }
    return {name: round(timed(fn), 2) for name, fn in cases.items()}


def plans(store: SQLStore) -> None:
    table = store._schema.threads.name
    postgres = store._engine.dialect.name == "postgresql"
    explain = "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF)" if postgres else "EXPLAIN QUERY PLAN"
    queries = {
        "status=stalled": f"SELECT * FROM {table} WHERE status = 'stalled'"
        " ORDER BY created_at DESC, id DESC LIMIT 51",
        "agent=billing": f"SELECT * FROM {table} WHERE agent = 'billing'"
        " ORDER BY created_at DESC, id DESC LIMIT 51",
    }
    with store._engine.connect() as conn:
        for name, sql in queries.items():
            print(f"-- {name}")
            for row in conn.execute(text(f"{explain} {sql}")):
                print("   ", " ".join(str(v) for v in row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=100_000)
    parser.add_argument("--sqlite", action="store_true")
    args = parser.parse_args()

    def run(url: str) -> None:
        store = SQLStore(url)
        began = time.perf_counter()
        fill(store, args.threads)
        print(f"filled {args.threads} threads in {time.perf_counter() - began:.1f} s")
        print(json.dumps(measure(store), indent=2))
        plans(store)
        store.close()

    if args.sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/listing.db"
            upgrade(url)
            run(url)
    else:

        def unavailable(reason: str) -> None:
            raise SystemExit(reason)

        with temporary_database("dormant_listing", unavailable) as url:
            run(url)


if __name__ == "__main__":
    main()
