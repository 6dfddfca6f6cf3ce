"""What a call held for approval costs while it waits, beside a call waiting on a deferred
tool (the idle thread's usual wait), on the embedded memory store and on PostgreSQL.

    python bench/approvals_cost.py [--threads 10000] [--postgres-url URL]

Each variant launches ``--threads`` threads whose model asks for one call and stops:
``held`` (``@tool(approval=True)``: a request item and a timer instead of an outbox row)
and ``deferred`` (``@tool(deferred=True)``, whose result never comes). Memory: the Python
heap the store keeps (``tracemalloc``, after a collection) and the store's own count of
bytes, per thread. PostgreSQL: ``pg_total_relation_size`` of every table, per thread, on
a database of its own that is dropped at the end. Nothing runs while they wait in either
variant: no task is queued and no worker slot held (the outbox of ``held`` is empty).
"""

from __future__ import annotations

import argparse
import gc
import secrets
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

from sqlalchemy import create_engine, text

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.messages import Item
from dormant.models import Completion, ScriptedModel, call, reply
from dormant.stores.memory.store import MemoryStore
from dormant.stores.sql.store import upgrade
from dormant.stores.sql.tables import metadata


@tool(approval=True)
def refund(order_id: str, amount: float) -> str:
    """Refund an order (held for approval)."""
    return "refunded"


@tool(deferred=True)
def start_refund(order_id: str, amount: float, ctx: ToolContext) -> None:
    """Start a refund whose result comes later (never, here)."""


def _asks(name: str) -> ScriptedModel:
    def script(_items: Sequence[Item]) -> Completion:
        return reply("", call(name, order_id="A-17", amount=250.0))

    return ScriptedModel(script)


AGENTS = [
    Agent("held", model=_asks("refund"), tools=[refund]),
    Agent("deferred", model=_asks("start_refund"), tools=[start_refund]),
]


def _launch(system: LocalSystem, agent: str, count: int) -> list[str]:
    ids = [system.launch(agent, f"refund {n}") for n in range(count)]
    system.run_until_idle(timeout_s=600)
    return ids


def memory(count: int) -> dict[str, float]:
    results: dict[str, float] = {}
    for agent in ("held", "deferred"):
        gc.collect()
        tracemalloc.start()
        with LocalSystem(AGENTS, "memory://") as system:
            ids = _launch(system, agent, count)
            for a in AGENTS:
                a.model.requests.clear()  # type: ignore[union-attr]
            gc.collect()
            heap, _ = tracemalloc.get_traced_memory()
            store = system.store
            assert isinstance(store, MemoryStore)
            stored = sum(store.stored_bytes(t) for t in ids) / count
            tracemalloc.stop()
            results[f"{agent}: heap bytes per thread"] = heap / count
            results[f"{agent}: stored bytes per thread"] = stored
            if agent == "held":
                assert len(system.pending_approvals(limit=count + 1)) == count
    return results


def postgres(count: int, admin_url: str) -> dict[str, float]:
    results: dict[str, float] = {}
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    for agent in ("held", "deferred"):
        name = f"dormant_bench_{secrets.token_hex(4)}"
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        url = admin_url.rsplit("/", 1)[0] + f"/{name}"
        try:
            upgrade(url)
            with LocalSystem(AGENTS, database_url=url) as system:
                _launch(system, agent, count)
            engine = create_engine(url, isolation_level="AUTOCOMMIT")
            with engine.connect() as conn:
                conn.execute(text("VACUUM ANALYZE"))
                total = sum(
                    conn.execute(text(f"SELECT pg_total_relation_size('{t}')")).scalar_one()
                    for t in metadata.tables
                )
            engine.dispose()
            results[f"{agent}: PostgreSQL bytes per thread"] = total / count
        finally:
            with admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=10_000)
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--skip-postgres", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    results: dict[str, Any] = memory(args.threads)
    if not args.skip_postgres:
        results |= postgres(args.threads, args.postgres_url)
    for key, value in results.items():
        print(f"{key:45} {value:10.0f}")
    print(f"({args.threads} threads a variant, {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
