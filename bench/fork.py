"""What a fork costs as its source grows: time and bytes at 10 and 10,000 source items.

    .venv/bin/python bench/fork.py [--postgres postgresql://postgres@127.0.0.1:5432/db]

For each store (memory, a SQLite file, and PostgreSQL when given a migrated database's
URL) it makes a source thread of 10 and one of 10,000 items (turns of user text and model
text, written in one transaction: the model plays no part in what a fork costs), forks
each at its last item ``--forks`` times, and prints the median fork time, the rows and
the bytes each fork wrote (a thread row, and the items it owns: none when no call is open),
and the 10,000 / 10 ratio. A fork by reference should show a ratio near 1; a copy would
show one near 1,000.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine, text

from dormant.messages import AssistantTurn, Item, UserText
from dormant.runtime.forks import fork_thread
from dormant.stores.base import NewThread, Store, StoredItem
from dormant.stores.memory.store import MemoryStore
from dormant.stores.sql.store import SQLStore, upgrade

SIZES = (10, 10_000)


def _source(store: Store, thread_id: str, n: int) -> None:
    def item(seq: int) -> Item:
        if seq % 2:
            return UserText(text=f"question {seq}: is build {seq} green yet?")
        return AssistantTurn(text=f"answer {seq}: build {seq - 1} is green, all 312 tests pass.")

    items = [StoredItem(seq, f"m{seq}", item(seq)) for seq in range(1, n + 1)]
    store.create_thread(NewThread(id=thread_id, agent="bench", items=items))


def _median_fork_s(store: Store, source: str, at_seq: int, forks: int) -> tuple[float, list[str]]:
    made: list[str] = []
    times = []
    for _ in range(forks):
        started = time.perf_counter()
        made.append(fork_thread(store, source, at_seq).id)
        times.append(time.perf_counter() - started)
    return statistics.median(times), made


def _sql_bytes(url: str, prefix: str = "") -> Callable[[list[str]], tuple[int, int]]:
    """Rows and bytes the forks own in SQL: their thread rows and items (stored sizes)."""
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    size = "length" if url.startswith("sqlite") else "octet_length"

    def measure(ids: list[str]) -> tuple[int, int]:
        marks = ", ".join(f"'{i}'" for i in ids)
        thread_bytes = (
            f"coalesce(sum({size}(cast(metadata as text)) + {size}(id) + {size}(agent)"
            f" + {size}(root_id) + {size}(coalesce(source_id, '')) + 64), 0)"
        )
        with engine.connect() as conn:
            threads = conn.execute(
                text(f"select count(*), {thread_bytes} from {prefix}threads where id in ({marks})")
            ).one()
            items = conn.execute(
                text(
                    f"select count(*), coalesce(sum({size}(packed)), 0) from {prefix}items "
                    f"where thread_id in ({marks})"
                )
            ).one()
        return (threads[0] + items[0]) // len(ids), (threads[1] + items[1]) // len(ids)

    return measure


def _memory_bytes(store: MemoryStore) -> Callable[[list[str]], tuple[int, int]]:
    def measure(ids: list[str]) -> tuple[int, int]:
        held = [store._threads[i] for i in ids]
        nbytes = sum(len(t.info) + len(t.calls) + t.log.nbytes() for t in held)
        return 1, nbytes // len(ids)

    return measure


def run(
    name: str, store: Store, measure: Callable[[list[str]], tuple[int, int]], forks: int
) -> None:
    figures = {}
    for n in SIZES:
        source = f"thr_bench_{name}_{n}"
        _source(store, source, n)
        seconds, made = _median_fork_s(store, source, n, forks)
        rows, nbytes = measure(made)
        figures[n] = seconds
        per_fork = f"{rows} row(s), {nbytes} bytes"
        print(f"{name:<10} source {n:>6} items: fork {seconds * 1e3:7.3f} ms, {per_fork}")
    small, big = SIZES
    print(f"{name:<10} fork time 10,000 / 10 items: {figures[big] / figures[small]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", help="a migrated PostgreSQL database's URL")
    parser.add_argument("--forks", type=int, default=21, help="forks per size (median)")
    args = parser.parse_args()
    memory = MemoryStore()
    run("memory", memory, _memory_bytes(memory), args.forks)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'fork.db'}"
        upgrade(url)
        sqlite = SQLStore(url)
        run("sqlite", sqlite, _sql_bytes(url), args.forks)
        sqlite.close()
    if args.postgres:
        upgrade(args.postgres)
        postgres = SQLStore(args.postgres)
        run("postgres", postgres, _sql_bytes(args.postgres), args.forks)
        postgres.close()


if __name__ == "__main__":
    main()
