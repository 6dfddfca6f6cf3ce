"""The SQL store's hot statements, built once per table prefix and dialect.

Building a SQLAlchemy statement (``select(...).where(...)``) and generating its cache key
cost far more Python than SQLite spends running it, and a statement whose shape changes
with its data (``insert().values([...])`` with a varying row count, ``IN`` with a literal
list, ``CASE`` over ids) misses the compiled cache and is compiled again every time. So
each statement a slice, an enqueue or a sweep runs is built here once, with named bind
parameters (``expanding`` ones for ``IN`` lists), and executed with a parameter dict, or a
list of dicts (``executemany``, a multi-row ``VALUES`` where the dialect supports it) for
many rows: the statement object, its cache key and its compiled form are all reused.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    CompoundSelect,
    Connection,
    Insert,
    Select,
    Update,
    and_,
    bindparam,
    case,
    func,
    literal_column,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from dormant.stores.base import InboxState, Priority, ThreadStatus
from dormant.stores.sql.rows import is_pending, tables
from dormant.stores.sql.tables import Schema, schema

__all__ = ["Prepared", "prepared"]

_OPEN: tuple[Any, ...] = tuple(
    literal_column(f"'{s.value}'") for s in (InboxState.PENDING, InboxState.DEFERRED)
)


def is_open(inbox: Any) -> Any:
    """``rows.is_open`` with its states written as literals: an ``IN`` list of bound
    values is rendered at every execution and cannot be used with ``executemany``."""
    return inbox.c.state.in_(_OPEN)


class Prepared:
    """The hot statements of one schema (table prefix) on one dialect."""

    def __init__(self, t: Schema, dialect: str) -> None:
        threads, items, calls, inbox, outbox, timers = (
            t.threads,
            t.items,
            t.calls,
            t.inbox,
            t.outbox,
            t.timers,
        )
        pg = dialect == "postgresql"

        def ins(table: Any) -> Any:
            return insert_for_dialect(dialect, table)

        # threads
        self.get_thread: Select[Any] = select(threads).where(threads.c.id == bindparam("thread_id"))
        self.get_thread_share: Select[Any] = self.get_thread.with_for_update(read=True)
        self.create_thread: Insert = (
            ins(threads).on_conflict_do_nothing(index_elements=["id"]).returning(*threads.c)
        )
        seen = threads.c.inbox_seen
        advance = {
            "version": threads.c.version + 1,
            "status": bindparam("b_status"),
            "inbox_seen": case(
                (seen > bindparam("b_inbox_seen"), seen), else_=bindparam("b_inbox_seen")
            ),
            "failures": 0,
            "last_error": "",
            "retry_at": None,
            "updated_at": bindparam("now", type_=threads.c.updated_at.type),
            "code_version": case(
                (bindparam("b_code_version") == "", threads.c.code_version),
                else_=bindparam("b_code_version"),
            ),
        }
        guard = and_(threads.c.id == bindparam("thread_id"), threads.c.version == bindparam("v"))
        self.advance_thread: Update = update(threads).where(guard).values(advance)
        self.advance_thread_usage: Update = (
            update(threads)
            .where(guard)
            .values({**advance, "usage": bindparam("b_usage", type_=threads.c.usage.type)})
        )
        # A slice that called its model: its counters and, on a root, its tree totals, in
        # the same statement (it returns the root's id: another thread's root gets an
        # increment of its own, so concurrent commits in one tree never lose each other's);
        # then its minute's ledger row.
        is_root = threads.c.root_id == threads.c.id
        self.advance_thread_spend: Update = (
            update(threads)
            .where(guard)
            .values(
                {
                    **advance,
                    "usage": bindparam("b_usage", type_=threads.c.usage.type),
                    "message_completions": bindparam("b_message_completions"),
                    "tree_tokens": case(
                        (is_root, threads.c.tree_tokens + bindparam("b_tokens")),
                        else_=threads.c.tree_tokens,
                    ),
                    "tree_cost_nanos": case(
                        (is_root, threads.c.tree_cost_nanos + bindparam("b_cost_nanos")),
                        else_=threads.c.tree_cost_nanos,
                    ),
                }
            )
            .returning(threads.c.root_id)
        )
        self.add_tree_spend: Update = (
            update(threads)
            .where(threads.c.id == bindparam("root_id"))
            .values(
                tree_tokens=threads.c.tree_tokens + bindparam("b_tokens"),
                tree_cost_nanos=threads.c.tree_cost_nanos + bindparam("b_cost_nanos"),
            )
        )
        ledger = ins(t.ledger)
        added = ("completions", "input_tokens", "output_tokens", "cached_tokens", "cost_nanos")
        self.add_to_ledger: Insert = ledger.on_conflict_do_update(
            index_elements=["thread_id", "at"],
            set_={name: t.ledger.c[name] + ledger.excluded[name] for name in added},
        )
        # a deploy met the thread: two in one seq (a slice that added no item) keep the
        # later version and the first one's ``previous``
        change = ins(t.version_changes)
        self.add_version_change: Insert = change.on_conflict_do_update(
            index_elements=["thread_id", "from_seq"],
            set_={"code_version": change.excluded.code_version, "at": change.excluded.at},
        )
        self.known_threads: Select[Any] = select(threads.c.id).where(
            threads.c.id.in_(bindparam("ids", expanding=True))
        )
        # items
        self.insert_items: Insert = items.insert()
        own = select(items).where(items.c.thread_id == bindparam("thread_id"))
        self.own_items: Select[Any] = own.order_by(items.c.seq)
        self.own_items_upto: Select[Any] = own.where(items.c.seq <= bindparam("upto")).order_by(
            items.c.seq
        )
        self.own_items_after: Select[Any] = own.where(items.c.seq > bindparam("after")).order_by(
            items.c.seq
        )
        self.own_items_between: Select[Any] = own.where(
            items.c.seq > bindparam("after"), items.c.seq <= bindparam("upto")
        ).order_by(items.c.seq)
        # A message id the thread had: in its history (items are unique by message id),
        # or pruned from its inbox without leaving an item (``pruned_ids``, by digest).
        pruned = t.pruned_ids
        self.seen_before: CompoundSelect[Any] = union_all(
            select(literal_column("1").label("hit")).where(
                items.c.thread_id == bindparam("thread_id"),
                items.c.message_id == bindparam("message_id"),
            ),
            select(literal_column("1").label("hit")).where(
                pruned.c.thread_id == bindparam("thread_id"),
                pruned.c.digest == bindparam("digest", type_=pruned.c.digest.type),
            ),
        )
        # calls
        upsert = ins(calls)
        changed = ("name", "args", "seq", "state", "subscription", "passive")
        self.upsert_calls: Insert = upsert.on_conflict_do_update(
            index_elements=["thread_id", "call_id"],
            set_={name: upsert.excluded[name] for name in changed},
        )
        self.calls_of: Select[Any] = select(calls).where(
            calls.c.thread_id == bindparam("thread_id")
        )
        self.call: Select[Any] = self.calls_of.where(calls.c.call_id == bindparam("call_id"))
        its_call = and_(calls.c.thread_id == threads.c.id, calls.c.call_id == bindparam("call_id"))
        self.thread_and_call: Select[Any] = (
            select(threads.c.status, threads.c.closed_reason, calls.c.state, calls.c.subscription)
            .select_from(threads.outerjoin(calls, its_call))
            .where(threads.c.id == bindparam("thread_id"))
            .with_for_update(read=True, of=threads)
        )
        # inbox
        self.insert_inbox: Insert = inbox.insert().returning(*inbox.c)
        self.insert_inbox_new: Insert = (
            ins(inbox)
            .on_conflict_do_nothing(index_elements=["thread_id", "message_id"])
            .returning(*inbox.c)
        )
        self.open_inbox: Select[Any] = (
            select(inbox)
            .where(inbox.c.thread_id == bindparam("thread_id"), is_open(inbox))
            .order_by(inbox.c.id)
        )
        self.inbox_id_of: Select[Any] = select(inbox.c.id).where(
            inbox.c.thread_id == bindparam("thread_id"),
            inbox.c.message_id == bindparam("message_id"),
        )
        waiting = (
            select(inbox.c.id)
            .where(inbox.c.thread_id == bindparam("thread_id"), is_open(inbox))
            .limit(bindparam("max_open"))
            .subquery()
        )
        self.open_depth: Select[Any] = select(func.count()).select_from(waiting)
        mine_open = (
            inbox.c.id == bindparam("row_id"),
            inbox.c.thread_id == bindparam("b_thread_id"),
            is_open(inbox),
        )
        # A done row's context becomes its applying slice's (none: the sender's stays).
        applied_trace = func.coalesce(func.nullif(bindparam("b_trace"), ""), inbox.c.trace)
        self.finish_row: Update = (
            update(inbox).where(*mine_open).values(state=bindparam("b_state"), trace=applied_trace)
        )
        self.reject_row: Update = (
            update(inbox)
            .where(
                inbox.c.id == bindparam("row_id"),
                inbox.c.thread_id == bindparam("b_thread_id"),
                is_open(inbox),
            )
            .values(state=InboxState.REJECTED.value, reason=bindparam("b_reason"))
        )
        pending_after = select(inbox.c.id).where(
            inbox.c.thread_id == bindparam("thread_id"),
            is_pending(inbox),
            inbox.c.id > bindparam("after"),
        )
        self.pending_after: Select[Any] = pending_after.limit(1)
        self.user_pending_after: Select[Any] = pending_after.where(inbox.c.kind == "user").limit(1)
        # outbox
        self.insert_outbox: Insert = outbox.insert().returning(*outbox.c)
        ids_unran = (outbox.c.id == bindparam("row_id"), outbox.c.ran_at.is_(None))
        stamp_type = outbox.c.ran_at.type
        self.mark_dispatched: Update = (
            update(outbox)
            .where(*ids_unran)
            .values(dispatched_at=bindparam("now", type_=stamp_type))
        )
        self.mark_ran: Update = (
            update(outbox).where(*ids_unran).values(ran_at=bindparam("now", type_=stamp_type))
        )
        # tool runs' claims (``claims.py``): one per tool run, one per renewal
        claim_type = outbox.c.claimed_until.type
        free = or_(
            outbox.c.claimed_until.is_(None),
            outbox.c.claimed_until < bindparam("now", type_=claim_type),
        )
        self.claim_outbox: Update = (
            update(outbox)
            .where(*ids_unran, free)
            .values(claimed_until=bindparam("until", type_=claim_type), runs=outbox.c.runs + 1)
            .returning(outbox.c.runs)
        )
        self.renew_outbox_claim: Update = (
            update(outbox)
            .where(*ids_unran)
            .values(claimed_until=bindparam("until", type_=claim_type))
        )
        # timers
        self.insert_timers: Insert = ins(timers).on_conflict_do_nothing(
            index_elements=["thread_id", "message_id"]
        )
        self.cancel_timers = timers.delete().where(
            timers.c.thread_id == bindparam("thread_id"),
            timers.c.call_id == bindparam("call_id"),
            timers.c.fired_at.is_(None),
        )
        self.claim_timer: Update = (
            update(timers)
            .where(timers.c.id == bindparam("timer_id"), timers.c.fired_at.is_(None))
            .values(fired_at=bindparam("now", type_=timers.c.fired_at.type))
        )
        due = (
            select(timers)
            .where(
                timers.c.fired_at.is_(None),
                timers.c.due_at <= bindparam("now", type_=timers.c.due_at.type),
            )
            .order_by(timers.c.due_at, timers.c.id)
            .limit(bindparam("limit"))
        )
        self.due_timers: Select[Any] = due.with_for_update(skip_locked=True) if pg else due
        self.next_timer_due: Select[Any] = (
            select(timers.c.due_at)
            .where(timers.c.fired_at.is_(None))
            .order_by(timers.c.due_at)
            .limit(1)
        )
        # sweeper
        wake = (
            select(inbox.c.thread_id, func.max(inbox.c.priority).label("priority"))
            .join(threads, threads.c.id == inbox.c.thread_id)
            .where(is_pending(inbox), threads.c.status != ThreadStatus.STALLED.value)
            .group_by(inbox.c.thread_id)
            # user text first, then the longest waiting
            .order_by(func.max(inbox.c.priority).desc(), func.min(inbox.c.id))
            .limit(bindparam("limit"))
        )
        self.threads_to_wake: Select[Any] = wake
        retry_type = threads.c.retry_at.type
        self.threads_to_wake_at: Select[Any] = wake.where(
            or_(
                threads.c.retry_at.is_(None),
                threads.c.retry_at <= bindparam("now", type_=retry_type),
                # deferred for model capacity (no failure): user text sent after the
                # deferral does not wait for the thread's place, even when its own wake
                # was lost; user text the deferral saw (told its turn) waits for its turn
                and_(
                    threads.c.failures == 0,
                    inbox.c.priority >= int(Priority.INTERACTIVE),
                    inbox.c.id > threads.c.inbox_seen,
                ),
            )
        )


def insert_for_dialect(dialect: str, table: Any) -> Any:
    """``rows.insert_for`` by dialect name, for statements built without a connection."""
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


@functools.cache
def _prepared(prefix: str, dialect: str) -> Prepared:
    return Prepared(schema(prefix), dialect)


def prepared(conn: Connection) -> Prepared:
    """The statements for ``conn``'s store (its table prefix) and database."""
    return _prepared(tables(conn).prefix, conn.dialect.name)
