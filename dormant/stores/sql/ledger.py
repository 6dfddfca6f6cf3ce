"""The usage ledger's one query: rows summed per agent (``dormant usage``, ``dormant show``).

Rows are written by the commit (``statements.add_spend``) and deleted with their thread
(``retention.py``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

from dormant.stores.base import Spend
from dormant.stores.records import usage_key
from dormant.stores.sql.rows import from_nanos
from dormant.stores.sql.tables import Schema, as_utc

__all__ = ["usage_by_agent"]


def usage_by_agent(
    t: Schema,
    tx: Callable[[], AbstractContextManager[Connection]],
    thread_id: str | None,
    agent: str | None,
    since: datetime | None,
) -> dict[str, Spend]:
    ledger, threads = t.ledger, t.threads
    sums: list[Any] = [
        func.sum(ledger.c.completions),
        func.sum(ledger.c.input_tokens),
        func.sum(ledger.c.output_tokens),
        func.sum(ledger.c.cached_tokens),
        func.sum(ledger.c.cost_nanos),
    ]
    query = (
        select(threads.c.agent, threads.c.tag, *sums)
        .select_from(ledger.join(threads, threads.c.id == ledger.c.thread_id))
        .group_by(threads.c.agent, threads.c.tag)
        .order_by(threads.c.agent, threads.c.tag)
    )
    if thread_id is not None:
        query = query.where(ledger.c.thread_id == thread_id)
    if agent is not None:
        query = query.where(threads.c.agent == agent)
    if since is not None:
        query = query.where(ledger.c.at >= as_utc(since))
    with tx() as conn:
        return {
            usage_key(name, tag): Spend(int(c), int(i), int(o), int(k), from_nanos(int(cost)))
            for name, tag, c, i, o, k, cost in conn.execute(query)
        }
