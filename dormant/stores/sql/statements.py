"""The SQL store's statements, run on the connection and transaction ``store.py`` opens.

Each writes many rows in one statement where it can (items, calls, inbox fates, outbox), so
a slice's commit costs a handful of round trips whatever its size.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select, update

from dormant.errors import (
    CallAnswered,
    DuplicateMessage,
    SubscriptionCancelled,
    ThreadClosed,
    UnknownCall,
    UnknownThread,
)
from dormant.messages import Inbound, Usage, UserMessage
from dormant.stores.base import (
    CallRecord,
    CallState,
    Commit,
    InboxRow,
    InboxState,
    NewThread,
    NewTimer,
    OutboxRow,
    Spend,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
)
from dormant.stores.closing import close_calls, streams_to_stop
from dormant.stores.digest import message_digest
from dormant.stores.sql.direct import run, run_many
from dormant.stores.sql.items import ItemCache
from dormant.stores.sql.prepared import prepared
from dormant.stores.sql.rows import (
    call_record,
    call_values,
    inbox_row,
    inbox_values,
    item_values,
    outbox_row,
    stored_item,
    tables,
    thread_info,
    thread_values,
    timer_values,
    to_nanos,
)

__all__ = [
    "ConnectionReader",
    "add_spend",
    "advance_thread",
    "cancel_timers",
    "check_inbound",
    "children",
    "claim_timer",
    "close_descendants",
    "create_thread",
    "enqueue_elsewhere",
    "finish_rows",
    "get_thread",
    "insert_inbox_ignoring_duplicates",
    "insert_items",
    "insert_outbox",
    "insert_timers",
    "own_items",
    "own_items_between",
    "seen_before",
    "upsert_calls",
]


def get_thread(conn: Connection, thread_id: str, *, share: bool = False) -> ThreadInfo:
    """The thread or ``UnknownThread``; ``share`` holds off concurrent commits to it."""
    ready = prepared(conn)
    query = ready.get_thread_share if share else ready.get_thread
    row = run(conn, query, {"thread_id": thread_id}).first()
    if row is None:
        raise UnknownThread(thread_id)
    return thread_info(row)


def create_thread(conn: Connection, thread: NewThread, now: datetime) -> ThreadInfo:
    """Insert a thread; the primary key, not a prior read, decides that it is new."""
    ready = prepared(conn)
    row = run(conn, ready.create_thread, thread_values(thread, now)).first()
    if row is None:
        raise DuplicateMessage(thread.id, thread.id)
    insert_items(conn, thread.id, thread.items)
    upsert_calls(conn, thread.id, thread.calls)
    if thread.messages:
        first = [
            inbox_values(thread.id, mid, m, p, now, thread.trace) for mid, m, p in thread.messages
        ]
        conn.execute(tables(conn).inbox.insert(), first)
    return thread_info(row)


def insert_inbox_ignoring_duplicates(conn: Connection, values: dict[str, Any]) -> InboxRow | None:
    """The new row, or None when the thread already received that message id."""
    row = run(conn, prepared(conn).insert_inbox_new, values).first()
    return None if row is None else inbox_row(row)


def upsert_calls(conn: Connection, thread_id: str, records: list[CallRecord]) -> None:
    if records:
        values = [call_values(thread_id, r) for r in records]
        run_many(conn, prepared(conn).upsert_calls, values)


def insert_items(conn: Connection, thread_id: str, stored: list[StoredItem]) -> None:
    if stored:
        values = [item_values(thread_id, s) for s in stored]
        run_many(conn, prepared(conn).insert_items, values)


def finish_rows(
    conn: Connection,
    thread_id: str,
    done: list[int],
    rejected: list[tuple[int, str]],
    deferred: list[int],
    trace: str = "",
) -> None:
    """Mark a slice's inbox rows done, rejected or deferred (one statement per fate, the
    same statement whatever the count); finished rows stay as they are. Only a rejection
    writes a reason: a done or deferred row keeps its own (a row retried after quarantine
    stays marked ``RETRIED_MARK``). A row named twice takes the last fate: rejected over
    deferred over done. A done row's ``trace`` becomes the applying slice's, if traced."""
    ready = prepared(conn)
    rejected_ids = {row_id for row_id, _ in rejected}
    deferred_only = [i for i in deferred if i not in rejected_ids]
    done_only = [i for i in done if i not in rejected_ids and i not in deferred_only]
    fates = [(i, InboxState.DONE.value) for i in done_only]
    fates += [(i, InboxState.DEFERRED.value) for i in deferred_only]
    if fates:
        done_state = InboxState.DONE.value
        many = [
            {
                "row_id": i,
                "b_thread_id": thread_id,
                "b_state": state,
                "b_trace": trace if state == done_state else "",
            }
            for i, state in fates
        ]
        run_many(conn, ready.finish_row, many)
    if rejected:
        reasons = dict(rejected)
        many = [{"row_id": i, "b_thread_id": thread_id, "b_reason": r} for i, r in reasons.items()]
        run_many(conn, ready.reject_row, many)


def insert_outbox(
    conn: Connection, entries: list[tuple[str, str, str]], now: datetime, trace: str = ""
) -> list[OutboxRow]:
    """Insert (thread_id, call_id, action) outbox rows in one statement, in that order,
    each with the writing slice's ``trace`` context."""
    if not entries:
        return []
    stmt = prepared(conn).insert_outbox
    fixed = {"created_at": now, "runs": 0, "trace": trace}
    found = [
        run(conn, stmt, {"thread_id": t, "call_id": c, "action": a, **fixed}).one()
        for t, c, a in entries
    ]
    return sorted((outbox_row(r) for r in found), key=lambda row: row.id)


def insert_timers(conn: Connection, thread_id: str, new: list[NewTimer]) -> None:
    """Insert timers; one whose (thread_id, message_id) exists already is ignored."""
    if new:
        run_many(conn, prepared(conn).insert_timers, [timer_values(thread_id, t) for t in new])


def cancel_timers(conn: Connection, thread_id: str, call_ids: list[str]) -> None:
    if call_ids:
        many = [{"thread_id": thread_id, "call_id": call_id} for call_id in call_ids]
        run_many(conn, prepared(conn).cancel_timers, many)


def claim_timer(conn: Connection, timer_id: int, now: datetime) -> bool:
    """Set ``fired_at`` unless another sweeper already did: the claim is the UPDATE."""
    params = {"timer_id": timer_id, "now": now}
    return run(conn, prepared(conn).claim_timer, params).rowcount == 1


def enqueue_elsewhere(
    conn: Connection, entries: list[tuple[str, str, Inbound, int]], now: datetime, trace: str = ""
) -> None:
    """Queue a commit's messages for other threads; duplicates and unknown targets are
    skipped (threads are never deleted, so reading the targets first is race-free)."""
    if not entries:
        return
    targets = sorted({thread_id for thread_id, *_ in entries})
    known = set(conn.execute(prepared(conn).known_threads, {"ids": targets}).scalars())
    for thread_id, message_id, message, priority in entries:
        if thread_id in known:
            values = inbox_values(thread_id, message_id, message, priority, now, trace)
            insert_inbox_ignoring_duplicates(conn, values)


def check_inbound(
    conn: Connection, thread_id: str, message_id: str, message: Inbound, *, answered_ok: bool
) -> None:
    """Refuse a message the thread can never accept (the sender sees why). Unless
    ``answered_ok``, a result for a call that has its result (not a subscription) is refused:
    ``DuplicateMessage`` if it is that result again, else ``CallAnswered``."""
    ready = prepared(conn)
    if isinstance(message, UserMessage):
        info = get_thread(conn, thread_id, share=True)
        if info.status is ThreadStatus.CLOSED:
            raise ThreadClosed(thread_id, info.closed_reason)
        return
    # The thread (locked against a concurrent close) and the call, in one round trip.
    params = {"thread_id": thread_id, "call_id": message.call_id}
    found = run(conn, ready.thread_and_call, params).first()
    if found is None:
        raise UnknownThread(thread_id)
    status, state, subscription = found["status"], found["state"], found["subscription"]
    if status == ThreadStatus.CLOSED.value:
        raise ThreadClosed(thread_id, found["closed_reason"])
    if state is None:
        raise UnknownCall(thread_id, message.call_id)
    if state == CallState.CANCELLED.value:
        raise SubscriptionCancelled(thread_id, message.call_id)
    if answered_ok or state != CallState.ANSWERED.value or subscription:
        return
    mine = {"thread_id": thread_id, "message_id": message_id}
    if run(conn, ready.inbox_id_of, mine).first() is not None or seen_before(
        conn, thread_id, message_id
    ):
        raise DuplicateMessage(thread_id, message_id)
    raise CallAnswered(thread_id, message.call_id, message_id)


def seen_before(conn: Connection, thread_id: str, message_id: str) -> bool:
    """Whether the thread had ``message_id`` though its inbox may no longer hold it: an item
    of its history came from it, or retention pruned its row (``pruned_ids``)."""
    digest = message_digest(message_id)
    params: dict[str, Any] = {"thread_id": thread_id, "message_id": message_id, "digest": digest}
    return run(conn, prepared(conn).seen_before, params).first() is not None


def advance_thread(conn: Connection, commit: Commit, now: datetime) -> bool:
    """The version guard and the thread's new state, in one statement."""
    ready = prepared(conn)
    params: dict[str, Any] = {
        "thread_id": commit.thread_id,
        "v": commit.version,
        "b_status": commit.status.value,
        "b_inbox_seen": commit.inbox_seen,
        "b_code_version": commit.code_version,
        "now": now,
    }
    stmt = ready.advance_thread
    if commit.usage is not None:
        params["b_usage"] = commit.usage.model_dump(mode="json")
        stmt = ready.advance_thread_usage
    spend = commit.spend
    if spend is not None:
        params["b_message_completions"] = commit.message_completions or 0
        params.setdefault("b_usage", (commit.usage or Usage()).model_dump(mode="json"))
        params["b_tokens"] = spend.tokens
        params["b_cost_nanos"] = to_nanos(spend.cost)
        found = run(conn, ready.advance_thread_spend, params).first()
        if found is None:
            return False
        add_spend(conn, commit.thread_id, found["root_id"], spend, now)
    elif run(conn, stmt, params).rowcount != 1:
        return False
    change = commit.version_change
    if change is not None:  # rare: a deploy met the thread
        row = {
            "thread_id": commit.thread_id,
            "from_seq": change.from_seq,
            "code_version": commit.code_version,
            "previous": change.previous,
            "at": now,
        }
        run(conn, ready.add_version_change, row)
    if commit.closed_reason:  # rare (a close from outside): its own statement
        threads = tables(conn).threads
        conn.execute(
            update(threads)
            .where(threads.c.id == commit.thread_id)
            .values(closed_reason=commit.closed_reason)
        )
    return True


def add_spend(conn: Connection, thread_id: str, root_id: str, spend: Spend, now: datetime) -> None:
    """The slice's usage on its minute's ledger row, and, for a thread that is not a root
    (a root's own commit added them already), its tokens and cost on its root's totals."""
    ready = prepared(conn)
    cost_nanos = to_nanos(spend.cost)
    if root_id != thread_id:
        totals = {"root_id": root_id, "b_tokens": spend.tokens, "b_cost_nanos": cost_nanos}
        run(conn, ready.add_tree_spend, totals)
    row = {
        "thread_id": thread_id,
        "at": now.replace(second=0, microsecond=0),
        "completions": spend.completions,
        "input_tokens": spend.input_tokens,
        "output_tokens": spend.output_tokens,
        "cached_tokens": spend.cached_tokens,
        "cost_nanos": cost_nanos,
    }
    run(conn, ready.add_to_ledger, row)


# Lineage: inheritance and closing a subtree ------------------------------------------


class ConnectionReader:
    """``lineage.OwnItems`` on one open connection: a history is read in one snapshot.

    With a ``cache``, a thread this reader has read (``first``, or through ``thread``)
    reads only the items committed since the cached ones (``items.py`` says why that
    is sound)."""

    def __init__(
        self, conn: Connection, cache: ItemCache | None = None, first: ThreadInfo | None = None
    ) -> None:
        self._conn = conn
        self._cache = cache
        self._seen = {} if first is None else {first.id: first}

    def thread(self, thread_id: str) -> ThreadInfo:
        info = get_thread(self._conn, thread_id)
        self._seen[thread_id] = info
        return info

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
        info = self._seen.get(thread_id)
        if self._cache is None or info is None:
            return own_items(self._conn, thread_id, upto_seq)
        cached = self._cache.known(info)
        if cached and upto_seq is not None and upto_seq <= cached[-1].seq:
            return [s for s in cached if s.seq <= upto_seq]
        after = cached[-1].seq if cached else None
        items = cached + tuple(_items_after(self._conn, thread_id, after))
        self._cache.keep(info, items)
        if upto_seq is None:
            return list(items)
        return [s for s in items if s.seq <= upto_seq]


def _items_after(conn: Connection, thread_id: str, after: int | None) -> list[StoredItem]:
    """All the thread's items, or those after seq ``after``, in order."""
    if after is None:
        return own_items(conn, thread_id)
    found = run(conn, prepared(conn).own_items_after, {"thread_id": thread_id, "after": after})
    return [stored_item(r) for r in found.rows]


def own_items(conn: Connection, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
    ready = prepared(conn)
    if upto_seq is None:
        found = run(conn, ready.own_items, {"thread_id": thread_id})
    else:
        found = run(conn, ready.own_items_upto, {"thread_id": thread_id, "upto": upto_seq})
    return [stored_item(r) for r in found.rows]


def own_items_between(
    conn: Connection, thread_id: str, after_seq: int, upto_seq: int
) -> list[StoredItem]:
    """The thread's items with ``after_seq < seq <= upto_seq``: one range of the primary key."""
    params = {"thread_id": thread_id, "after": after_seq, "upto": upto_seq}
    found = run(conn, prepared(conn).own_items_between, params)
    return [stored_item(r) for r in found.rows]


def children(conn: Connection, thread_id: str) -> list[ThreadInfo]:
    """Direct children, oldest first."""
    threads = tables(conn).threads
    query = (
        select(threads)
        .where(threads.c.parent_id == thread_id)
        .order_by(threads.c.created_at, threads.c.id)
    )
    return [thread_info(r) for r in conn.execute(query).mappings()]


def close_descendants(conn: Connection, thread_id: str, now: datetime) -> list[OutboxRow]:
    """Close every open descendant (depth first, oldest child first): its pending calls
    answered, its timers cancelled and its live subscriptions cancelled
    (``stores/closing.py``); the "cancel" outbox rows let the tools' hooks stop their
    streams."""
    t = tables(conn)
    cancelled: list[OutboxRow] = []
    for child in children(conn, thread_id):
        if child.status is not ThreadStatus.CLOSED:
            found = run(conn, prepared(conn).calls_of, {"thread_id": child.id})
            calls = [call_record(r) for r in found.rows]
            last = conn.execute(
                select(func.max(t.items.c.seq)).where(t.items.c.thread_id == child.id)
            ).scalar()
            changed, results = close_calls(child.id, calls, (last or child.fork_seq or 0) + 1)
            upsert_calls(conn, child.id, changed)
            insert_items(conn, child.id, results)
            cancel_timers(conn, child.id, [c.call_id for c in calls])
            live = [(child.id, c.call_id, "cancel") for c in streams_to_stop(calls, child)]
            cancelled += insert_outbox(conn, live, now)
            conn.execute(
                update(t.threads)
                .where(t.threads.c.id == child.id)
                .values(
                    status=ThreadStatus.CLOSED.value,
                    closed_reason=f"its ancestor {thread_id} was closed",
                    version=t.threads.c.version + 1,
                    updated_at=now,
                )
            )
        cancelled += close_descendants(conn, child.id, now)
    return cancelled
