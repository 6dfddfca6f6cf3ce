"""Limits, quarantine and retention for the SQL store, kept apart from its hot paths.

``SQLRetention`` is mixed into ``SQLStore``: each method is one short transaction of the
store's own (``_tx``). Pruning deletes in batches of at most ``limit`` rows (or closed
thread trees) per transaction, oldest first, so no statement holds a hot table for long:
a batch touches only rows nobody writes any more (finished rows, closed threads).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Table, delete, exists, func, literal, or_, select, update
from sqlalchemy.sql import Select

from dormant.errors import DuplicateMessage, InboxFull, UnknownThread
from dormant.stores.base import (
    RETRIED_MARK,
    InboxRow,
    InboxState,
    PruneCounts,
    ThreadInfo,
    ThreadStatus,
)
from dormant.stores.sql import statements as statements
from dormant.stores.sql.direct import run
from dormant.stores.sql.engine import retry_busy
from dormant.stores.sql.prepared import prepared
from dormant.stores.sql.rows import inbox_row, is_open, thread_info
from dormant.stores.sql.tables import Schema, as_utc

__all__ = ["SQLRetention", "check_room"]

_FINISHED = (InboxState.DONE.value, InboxState.REJECTED.value)


def check_room(conn: Connection, thread_id: str, message_id: str, max_open: int | None) -> None:
    """Refuse a message id the history already holds (its inbox row may have been pruned,
    and a second copy would break the items' unique key at commit), and, with
    ``max_open``, a message for a thread whose inbox is full."""
    ready = prepared(conn)
    mine = {"thread_id": thread_id, "message_id": message_id}
    if run(conn, ready.in_history, mine).first() is not None:
        raise DuplicateMessage(thread_id, message_id)
    if max_open is None:
        return
    params = {"thread_id": thread_id, "max_open": max_open}
    depth = int(run(conn, ready.open_depth, params).scalars()[0])
    if depth >= max_open:
        raise InboxFull(thread_id, depth)


class SQLRetention:
    """Quarantine and pruning on ``SQLStore``'s tables and transactions."""

    _schema: Schema
    _postgres: bool

    def _tx(
        self, *, write: bool = False, snapshot: bool = False
    ) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    # quarantine ------------------------------------------------------------------------

    @retry_busy
    def quarantine(self, thread_id: str, inbox_id: int, reason: str) -> ThreadInfo:
        t = self._schema
        with self._tx(write=True) as conn:
            conn.execute(
                update(t.inbox)
                .where(t.inbox.c.id == inbox_id, t.inbox.c.thread_id == thread_id, is_open(t.inbox))
                .values(state=InboxState.QUARANTINED.value, reason=reason)
            )
            found = (
                conn.execute(
                    update(t.threads)
                    .where(t.threads.c.id == thread_id)
                    .values(
                        version=t.threads.c.version + 1,
                        failures=0,
                        retry_at=None,
                        updated_at=datetime.now(UTC),
                    )
                    .returning(*t.threads.c)
                )
                .mappings()
                .first()
            )
        if found is None:
            raise UnknownThread(thread_id)
        return thread_info(found)

    @retry_busy
    def release_quarantined(self, thread_id: str, message_id: str | None = None) -> list[InboxRow]:
        inbox = self._schema.inbox
        stmt = update(inbox).where(
            inbox.c.thread_id == thread_id, inbox.c.state == InboxState.QUARANTINED.value
        )
        if message_id is not None:
            stmt = stmt.where(inbox.c.message_id == message_id)
        stmt = stmt.values(
            state=InboxState.PENDING.value, reason=literal(RETRIED_MARK) + inbox.c.reason
        ).returning(*inbox.c)
        with self._tx(write=True) as conn:
            released = [inbox_row(r) for r in conn.execute(stmt).mappings()]
            if not released:
                statements.get_thread(conn, thread_id)
        return sorted(released, key=lambda r: r.id)

    @retry_busy
    def quarantined(self, limit: int = 100) -> list[InboxRow]:
        inbox = self._schema.inbox
        query = (
            select(inbox)
            .where(inbox.c.state == InboxState.QUARANTINED.value)
            .order_by(inbox.c.id)
            .limit(limit)
        )
        with self._tx() as conn:
            return [inbox_row(r) for r in conn.execute(query).mappings()]

    # retention -------------------------------------------------------------------------

    def prune_batch(
        self, older_than: datetime, limit: int, *, dry_run: bool = False
    ) -> PruneCounts:
        cutoff = as_utc(older_than)
        if dry_run:
            return self._count_prunable(cutoff)
        return PruneCounts(
            threads=self._prune_trees(cutoff, limit),
            inbox=self._prune_rows(self._schema.inbox, self._finished_inbox(cutoff), limit),
            outbox=self._prune_rows(self._schema.outbox, self._ran_outbox(cutoff), limit),
            timers=self._prune_rows(self._schema.timers, self._fired_timers(cutoff), limit),
        )

    def _prunable_roots(self, cutoff: datetime) -> Select[Any]:
        """Closed root threads untouched since ``cutoff`` whose whole tree is too."""
        threads = self._schema.threads
        member = threads.alias("member")
        live_member = exists().where(
            member.c.root_id == threads.c.id,
            or_(member.c.status != ThreadStatus.CLOSED.value, member.c.updated_at >= cutoff),
        )
        return select(threads.c.id).where(
            threads.c.parent_id.is_(None),
            threads.c.status == ThreadStatus.CLOSED.value,
            threads.c.updated_at < cutoff,
            ~live_member,
        )

    def _finished_inbox(self, cutoff: datetime) -> Any:
        inbox = self._schema.inbox
        return (inbox.c.state.in_(_FINISHED), inbox.c.created_at < cutoff)

    def _ran_outbox(self, cutoff: datetime) -> Any:
        outbox = self._schema.outbox
        return (outbox.c.ran_at.is_not(None), outbox.c.ran_at < cutoff)

    def _fired_timers(self, cutoff: datetime) -> Any:
        timers = self._schema.timers
        return (timers.c.fired_at.is_not(None), timers.c.fired_at < cutoff)

    @retry_busy
    def _prune_trees(self, cutoff: datetime, limit: int) -> int:
        """One transaction: up to ``limit`` closed trees, each with everything it owns."""
        t = self._schema
        with self._tx(write=True) as conn:
            roots = list(conn.execute(self._prunable_roots(cutoff).limit(limit)).scalars())
            if not roots:
                return 0
            members = select(t.threads.c.id).where(t.threads.c.root_id.in_(roots))
            if self._postgres:
                # Lock the tree first: a concurrent enqueue (which reads the thread FOR
                # SHARE) then waits, and finds no thread, instead of adding a row we miss.
                conn.execute(members.with_for_update())
            ids = list(conn.execute(members).scalars())
            for table in (t.items, t.calls, t.inbox, t.outbox, t.timers):
                conn.execute(delete(table).where(table.c.thread_id.in_(ids)))
            conn.execute(delete(t.threads).where(t.threads.c.id.in_(ids)))
            return len(ids)

    @retry_busy
    def _prune_rows(self, table: Table, where: tuple[Any, ...], limit: int) -> int:
        """One transaction: the oldest ``limit`` rows of ``table`` matching ``where``."""
        with self._tx(write=True) as conn:
            batch = select(table.c.id).where(*where).order_by(table.c.id).limit(limit)
            ids = list(conn.execute(batch).scalars())
            if ids:
                conn.execute(delete(table).where(table.c.id.in_(ids)))
            return len(ids)

    @retry_busy
    def _count_prunable(self, cutoff: datetime) -> PruneCounts:
        t = self._schema

        def count(query: Select[Any]) -> int:
            return int(
                conn.execute(select(func.count()).select_from(query.subquery())).scalar_one()
            )

        with self._tx() as conn:
            roots = self._prunable_roots(cutoff)
            return PruneCounts(
                threads=count(select(t.threads.c.id).where(t.threads.c.root_id.in_(roots))),
                inbox=count(select(t.inbox.c.id).where(*self._finished_inbox(cutoff))),
                outbox=count(select(t.outbox.c.id).where(*self._ran_outbox(cutoff))),
                timers=count(select(t.timers.c.id).where(*self._fired_timers(cutoff))),
            )
