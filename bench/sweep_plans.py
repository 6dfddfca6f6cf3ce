"""The plans PostgreSQL runs for every sweeper and claim query, for ``bench/idle_scale.py``.

Each query is run by dormant's own ``SQLStore`` methods, as the sweeper (``sweep_once``,
``close_idle_threads``) and a tool task (its claim, heartbeat and stamps) call them: no copy
of their SQL is kept here to drift from the store's. The store's sessions load
``auto_explain`` (the bench's role is a superuser) with ``log_analyze`` and
``log_buffers``, and send each plan back as a notice, so what is captured is the plan the
server actually ran: ``EXPLAIN (ANALYZE, BUFFERS)`` of the very statement, with its real
parameters, after the warm-up runs that let the server pick a generic plan for a prepared
statement if it would (psycopg prepares a statement on its sixth run).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url

from dormant.messages import UserMessage
from dormant.stores.base import NewTimer
from dormant.stores.sql.store import SQLStore

__all__ = ["sweep_plans"]

_AUTO_EXPLAIN = (
    "-c session_preload_libraries=auto_explain -c auto_explain.log_min_duration=0 "
    "-c auto_explain.log_analyze=on -c auto_explain.log_buffers=on "
    "-c auto_explain.log_level=notice"
)
_RUNS = 8
"""Runs of each query; the last one's plan is kept (past psycopg's prepare threshold)."""


def sweep_plans(database_url: str, thread_id: str, agent: str) -> dict[str, str]:
    """The plan of each sweeper and claim query, by the store method that ran it, on the
        database as it is; ``thread_id`` (an idle thread of ``agent``) gets one due timer, so
        that the timer claim runs too (its message lands in the thread's inbox, and the thread's
    load on waking is shown last)."""
    url = make_url(database_url).update_query_dict({"options": _AUTO_EXPLAIN})
    store = SQLStore(url.render_as_string(hide_password=False))
    notices: list[str] = []

    def listen(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.add_notice_handler(lambda diag: notices.append(diag.message_primary))

    event.listen(store._engine, "connect", listen)
    outbox_id = _an_outbox_row(store)
    now = datetime.now(UTC)
    queries: dict[str, Callable[[], object]] = {
        "fire_due_timers: due timers": lambda: store.fire_due_timers(now),
        "next_timer_due": store.next_timer_due,
        "expired_claims": lambda: store.expired_claims(now),
        "undispatched (with lost_before)": lambda: store.undispatched(
            now - timedelta(seconds=10), lost_before=now - timedelta(seconds=300)
        ),
        "reclaim_outbox": lambda: store.reclaim_outbox(outbox_id, now),
        "wakes_due": lambda: store.wakes_due(now=now),
        "idle_threads (close after idle)": lambda: store.idle_threads(agent, now),
        "claim_outbox": lambda: store.claim_outbox(outbox_id, now + timedelta(seconds=60)),
        "renew_outbox_claim": lambda: store.renew_outbox_claim(
            outbox_id, now + timedelta(seconds=60)
        ),
        "mark_dispatched": lambda: store.mark_dispatched([outbox_id]),
        "mark_ran": lambda: store.mark_ran([outbox_id]),
    }
    # Not the sweeper's: what a slice reads when the timer's message wakes the thread
    # (thread, items past the worker's cache, calls, open inbox rows), every statement.
    woken = {"load (a slice's read on waking)": lambda: store.load(thread_id)}
    plans: dict[str, str] = {}
    try:
        message = UserMessage(text="a scheduled reminder")
        store.add_timer(thread_id, NewTimer("bench_timer", now, "timer:bench", message))
        notices.clear()
        store.fire_due_timers(now)  # the one run that finds the timer: it claims it
        plans["fire_due_timers: claim_timer"] = _only(notices, "UPDATE")
        for name, query in queries.items():
            for _ in range(_RUNS):
                notices.clear()
                query()
            plans[name] = _last_statement(notices)
        for name, query in woken.items():
            for _ in range(_RUNS):
                notices.clear()
                query()
            plans[name] = "\n".join(n for n in notices if "Query Text:" in n)
    finally:
        store.close()
    return plans


def _an_outbox_row(store: SQLStore) -> int:
    """An outbox row that ran (every copied thread's): claims on it are refused, as a
    duplicate task's are, so the queries change nothing."""
    with store._engine.connect() as conn:
        return int(conn.execute(text("SELECT max(id) FROM outbox")).scalar_one())


def _only(notices: list[str], verb: str) -> str:
    found = [n for n in notices if re.search(rf"Query Text: {verb}\b", n)]
    if not found:
        raise LookupError(f"no {verb} statement among {len(notices)} plans")
    return found[-1]


def _last_statement(notices: list[str]) -> str:
    """The plan of the query proper: the last notice that is not BEGIN or COMMIT (which
    ``auto_explain`` does not log anyway)."""
    found = [n for n in notices if "Query Text:" in n]
    if not found:
        raise LookupError("no plan was sent back: is auto_explain installed?")
    return found[-1]
