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

from sqlalchemy import Connection, Table, and_, delete, exists, func, literal, or_, select, update
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
from dormant.stores.digest import message_digest
from dormant.stores.sql import statements as statements
from dormant.stores.sql.direct import run
from dormant.stores.sql.engine import retry_busy
from dormant.stores.sql.prepared import prepared
from dormant.stores.sql.rows import inbox_row, insert_for, is_open, thread_info
from dormant.stores.sql.tables import Schema, as_utc

__all__ = ["SQLRetention", "check_room"]

_FINISHED = (InboxState.DONE.value, InboxState.REJECTED.value)


def check_room(conn: Connection, thread_id: str, message_id: str, max_open: int | None) -> None:
    """Refuse a message id the thread already had though its inbox row was pruned (in the
    history, where a second copy would break the items' unique key at commit, or in
    ``pruned_ids``), and, with
    ``max_open``, a message for a thread whose inbox is full."""
    ready = prepared(conn)
    if statements.seen_before(conn, thread_id, message_id):
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
        in_trees = self._prune_trees(cutoff, limit) + self._prune_subtrees(cutoff, limit)
        return in_trees + PruneCounts(
            inbox=self._prune_inbox(cutoff, limit),
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
        # A fork reads its source's items: a tree with a source in it waits for its forks.
        source, fork = threads.alias("source"), threads.alias("fork")
        forked = exists().where(source.c.root_id == threads.c.id, fork.c.source_id == source.c.id)
        return select(threads.c.id).where(
            threads.c.parent_id.is_(None),
            threads.c.status == ThreadStatus.CLOSED.value,
            threads.c.updated_at < cutoff,
            ~live_member,
            ~forked,
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
    def _prune_trees(self, cutoff: datetime, limit: int) -> PruneCounts:
        """One transaction: up to ``limit`` closed trees, each with everything it owns."""
        t = self._schema
        with self._tx(write=True) as conn:
            roots = list(conn.execute(self._prunable_roots(cutoff).limit(limit)).scalars())
            if not roots:
                return PruneCounts()
            members = select(t.threads.c.id).where(t.threads.c.root_id.in_(roots))
            if self._postgres:
                # Lock the tree first: a concurrent enqueue (which reads the thread FOR
                # SHARE) then waits, and finds no thread, instead of adding a row we miss.
                conn.execute(members.with_for_update())
            ids = list(conn.execute(members).scalars())
            return self._delete_threads(conn, ids)

    def _delete_threads(self, conn: Connection, ids: list[str]) -> PruneCounts:
        """Every row of these threads, in every table: a pruned thread leaves nothing.
        The counts: the threads, and their inbox rows (finished or not), outbox rows and
        timers, so that what is reported deleted is what was."""
        t = self._schema
        deleted: dict[str, int] = {}
        owned = (t.items, t.calls, t.inbox, t.outbox, t.timers, t.pruned_ids, t.ledger)
        for table in (*owned, t.version_changes):
            gone = conn.execute(delete(table).where(table.c.thread_id.in_(ids)))
            deleted[table.name] = gone.rowcount
        conn.execute(delete(t.threads).where(t.threads.c.id.in_(ids)))
        return PruneCounts(
            threads=len(ids),
            inbox=deleted[t.inbox.name],
            outbox=deleted[t.outbox.name],
            timers=deleted[t.timers.name],
        )

    def _closed_under_open(self, cutoff: datetime) -> Select[Any]:
        """Closed threads untouched since ``cutoff`` whose parent is open, once the parent
        has applied everything they sent it: no waiting (or quarantined) row of the parent
        is older than the child's last change, and a report is queued with that change."""
        t = self._schema
        child, parent, inbox = t.threads, t.threads.alias("parent"), t.inbox
        waiting = (InboxState.PENDING, InboxState.DEFERRED, InboxState.QUARANTINED)
        unapplied = exists().where(
            inbox.c.thread_id == parent.c.id,
            inbox.c.state.in_([s.value for s in waiting]),
            inbox.c.created_at <= child.c.updated_at,
        )
        return (
            select(child.c.id)
            .join(parent, parent.c.id == child.c.parent_id)
            .where(
                child.c.status == ThreadStatus.CLOSED.value,
                child.c.updated_at < cutoff,
                parent.c.status != ThreadStatus.CLOSED.value,
                ~unapplied,
            )
            .order_by(child.c.updated_at, child.c.id)
        )

    def _subtree(self, conn: Connection, top: str, cutoff: datetime) -> list[str] | None:
        """``top`` and its descendants if every one is closed and untouched since
        ``cutoff`` (a descendant inherits its ancestors' items: none goes alone)."""
        threads = self._schema.threads
        tree, level = [top], [top]
        while level:
            query = select(threads.c.id, threads.c.status, threads.c.updated_at).where(
                threads.c.parent_id.in_(level)
            )
            found = conn.execute(query).all()
            closed = ThreadStatus.CLOSED.value
            if any(status != closed or as_utc(at) >= cutoff for _, status, at in found):
                return None
            level = [thread_id for thread_id, _, _ in found]
            tree += level
        forked = select(threads.c.id).where(threads.c.source_id.in_(tree)).limit(1)
        if conn.execute(forked).first() is not None:
            return None  # a fork still reads its items: the subtree goes after it
        return tree

    @retry_busy
    def _prune_subtrees(self, cutoff: datetime, limit: int) -> PruneCounts:
        """One transaction: up to ``limit`` closed subtrees under open parents (finished
        children and event threads of a root that lives on)."""
        threads = self._schema.threads
        with self._tx(write=True) as conn:
            tops = list(conn.execute(self._closed_under_open(cutoff).limit(limit)).scalars())
            trees = [tree for top in tops if (tree := self._subtree(conn, top, cutoff))]
            ids = [thread_id for tree in trees for thread_id in tree]
            if not ids:
                return PruneCounts()
            if self._postgres:  # as in _prune_trees: a concurrent enqueue waits, then fails
                conn.execute(select(threads.c.id).where(threads.c.id.in_(ids)).with_for_update())
            return self._delete_threads(conn, ids)

    @retry_busy
    def _prune_inbox(self, cutoff: datetime, limit: int) -> int:
        """One transaction: the oldest ``limit`` finished inbox rows of live threads. The
        id of a row that left no item in the history is kept as a digest in ``pruned_ids``,
        so the same message sent again is still a duplicate."""
        t = self._schema
        inbox, items = t.inbox, t.items
        in_history = exists().where(
            items.c.thread_id == inbox.c.thread_id, items.c.message_id == inbox.c.message_id
        )
        batch = (
            select(inbox.c.id, inbox.c.thread_id, inbox.c.message_id, in_history.label("kept"))
            .where(*self._finished_inbox(cutoff))
            .order_by(inbox.c.id)
            .limit(limit)
        )
        with self._tx(write=True) as conn:
            found = conn.execute(batch).all()
            if not found:
                return 0
            remembered = [
                {"thread_id": thread_id, "digest": message_digest(message_id)}
                for _, thread_id, message_id, kept in found
                if not kept
            ]
            if remembered:
                conn.execute(insert_for(conn, t.pruned_ids).on_conflict_do_nothing(), remembered)
            conn.execute(delete(inbox).where(inbox.c.id.in_([row[0] for row in found])))
            return len(found)

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
            subtrees = [
                tree
                for top in conn.execute(self._closed_under_open(cutoff)).scalars()
                if (tree := self._subtree(conn, top, cutoff))
            ]
            in_trees = count(select(t.threads.c.id).where(t.threads.c.root_id.in_(roots)))
            under_open = [thread_id for tree in subtrees for thread_id in tree]

            def rows(table: Table, where: tuple[Any, ...]) -> int:
                """A pruned thread's rows all go, the others' as ``where`` says."""
                members = select(t.threads.c.id).where(t.threads.c.root_id.in_(roots))
                doomed = or_(table.c.thread_id.in_(members), table.c.thread_id.in_(under_open))
                return count(select(table.c.id).where(or_(doomed, and_(*where))))

            return PruneCounts(
                threads=in_trees + len(under_open),
                inbox=rows(t.inbox, self._finished_inbox(cutoff)),
                outbox=rows(t.outbox, self._ran_outbox(cutoff)),
                timers=rows(t.timers, self._fired_timers(cutoff)),
            )
