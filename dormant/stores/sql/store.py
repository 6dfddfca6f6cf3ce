"""The SQL history store: SQLite (the embedded default) and PostgreSQL, one code path.

Every rule that matters is a SQL guarantee, never a check-then-write: the version guard is
an ``UPDATE ... WHERE version = :expected``, dedup is a unique key, timers are claimed by a
conditional ``UPDATE`` (with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL so sweepers never
queue behind each other).

On SQLite a busy database is waited for, never a failed slice (``engine.py`` says how);
here, the threads of one process queue for SQLite's one write lock on a Python lock rather
than in SQLite's sleep-and-poll busy handler, which can starve one waiter for seconds on a
loaded machine, and every transaction is run again if SQLite still reports it busy.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Connection, case, select, tuple_, update
from sqlalchemy.exc import IntegrityError

from dormant.errors import DuplicateMessage, UnknownCall, UnknownThread
from dormant.messages import Inbound
from dormant.stores.base import (
    CallRecord,
    Commit,
    InboxRow,
    InboxState,
    NewThread,
    NewTimer,
    OutboxRow,
    Snapshot,
    Spend,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
)
from dormant.stores.lineage import next_seq, visible_history
from dormant.stores.sql import statements as rows
from dormant.stores.sql.claims import SQLClaims
from dormant.stores.sql.commits import commit_at_once, plain, sent_at_once
from dormant.stores.sql.direct import direct_transaction, run, run_many
from dormant.stores.sql.engine import SQLITE_BEGIN, is_memory, make_engine, retry_busy
from dormant.stores.sql.items import ITEM_CACHE_BYTES, ItemCache
from dormant.stores.sql.kept import KeptConnections
from dormant.stores.sql.ledger import usage_by_agent
from dormant.stores.sql.loads import OneTripLoads
from dormant.stores.sql.migrate import MIGRATIONS_DIR, migrate, upgrade
from dormant.stores.sql.prepared import prepared
from dormant.stores.sql.retention import SQLRetention, check_room
from dormant.stores.sql.roster import SQLRoster
from dormant.stores.sql.rows import (
    SCHEMA_OPTION,
    call_record,
    inbox_row,
    inbox_values,
    is_unique_violation,
    thread_info,
)
from dormant.stores.sql.sends import insert_checked
from dormant.stores.sql.sweep import SQLSweep
from dormant.stores.sql.tables import as_utc, schema
from dormant.stores.sql.timers import SQLTimerQuery
from dormant.stores.sql.versions import VERSION_TABLE, SchemaCheck

__all__ = ["MIGRATIONS_DIR", "VERSION_TABLE", "SQLStore", "make_engine", "upgrade"]


def _now() -> datetime:
    return datetime.now(UTC)


# The store ---------------------------------------------------------------------------


class SQLStore(SQLRetention, SQLClaims, SQLRoster, SQLSweep, SQLTimerQuery, SchemaCheck):
    """``Store`` on SQLite or PostgreSQL; safe to share between threads and processes.

    ``sqlite://`` (in memory) is migrated on construction since nobody else can reach it;
    file and server databases are migrated by ``upgrade()``. ``table_prefix`` selects the
    tables (``Settings.table_prefix``): stores with different prefixes share a database
    without seeing each other. Before its first transaction the store checks, once, that
    the database's schema is the one it was written for (``check_schema``).
    """

    def __init__(
        self,
        database_url: str,
        *,
        echo: bool = False,
        table_prefix: str = "",
        history_cache_bytes: int = ITEM_CACHE_BYTES,
    ) -> None:
        self._schema = schema(table_prefix)
        self._engine = make_engine(database_url, echo=echo)
        self._postgres = self._engine.dialect.name == "postgresql"
        memory = is_memory(self._engine.url)
        # A StaticPool's one connection must never carry two transactions at once.
        self._serial: AbstractContextManager[Any] = threading.RLock() if memory else nullcontext()
        # SQLite has one writer: this process's threads queue here, in order, rather than
        # in SQLite's sleep-and-poll busy handler.
        sqlite_file = self._engine.dialect.name == "sqlite" and not memory
        self._writer: AbstractContextManager[Any] = (
            threading.Lock() if sqlite_file else nullcontext()
        )
        # Each thread keeps its own SQLite connection: the pool's round costs more than a
        # transaction (kept.py).
        self._kept = KeptConnections(self._engine) if sqlite_file else None
        self._table_prefix = table_prefix
        self._schema_checked = memory  # nobody else reaches it: migrated here, to head
        if memory:
            migrate(self._engine, table_prefix)
        self._caller: Connection | None = None
        self._items = ItemCache(max_bytes=history_cache_bytes)
        self._loads = OneTripLoads()

    def on_connection(self, connection: Connection) -> SQLStore:
        """This store writing on the caller's connection, inside the caller's transaction:
        its rows commit or roll back with the caller's own. Each operation is a savepoint,
        so a refused write (a duplicate message) leaves the caller's transaction usable."""
        view = copy.copy(self)
        view._caller = connection
        # Nothing read inside a transaction that may still roll back is cached.
        view._items = ItemCache(max_bytes=0)
        return view

    @contextmanager
    def _tx(
        self,
        *,
        write: bool = False,
        snapshot: bool = False,
        direct: bool = False,
        alone: bool = False,
    ) -> Iterator[Connection]:
        """One transaction; ``write`` takes SQLite's lock up front, ``snapshot`` makes
        PostgreSQL reads agree with each other. ``direct`` (for a body that runs only
        ``direct.py`` statements) opens it on the driver connection, without SQLAlchemy's
        per-transaction work: the connection is then not a real ``Connection``. ``alone``
        (with ``direct``, for a body of one statement, or of reads that need not agree):
        on PostgreSQL each statement is its own transaction, one round trip where
        ``BEGIN``, it and ``COMMIT`` are three."""
        if not self._schema_checked:
            self._check_schema_and_say()
        if self._caller is not None:
            self._caller.execution_options(**{SCHEMA_OPTION: self._schema})
            with self._caller.begin_nested():
                yield self._caller
            return
        writer = self._writer if write else nullcontext()
        if direct:
            begin = None if self._postgres else ("IMMEDIATE" if write else "DEFERRED")
            options = {SCHEMA_OPTION: self._schema}
            with (
                self._serial,
                writer,
                direct_transaction(
                    self._engine,
                    options,
                    begin=begin,
                    snapshot=snapshot,
                    alone=alone,
                    kept=self._kept,
                ) as raw,
            ):
                yield cast(Connection, raw)
            return
        with self._serial, writer, self._engine.connect() as conn:
            conn.execution_options(**{SCHEMA_OPTION: self._schema})
            if write:
                conn.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
            if snapshot and self._postgres:
                conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn

    # threads -------------------------------------------------------------------------

    @retry_busy
    def create_thread(self, thread: NewThread) -> ThreadInfo:
        with self._tx(write=True) as conn:
            return rows.create_thread(conn, thread, _now())

    @retry_busy
    def thread(self, thread_id: str) -> ThreadInfo:
        with self._tx(direct=True, alone=True) as conn:
            return rows.get_thread(conn, thread_id)

    @retry_busy
    def threads(
        self,
        status: ThreadStatus | None = None,
        limit: int = 100,
        *,
        agent: str | None = None,
        before: tuple[datetime, str] | None = None,
        tag: str | None = None,
    ) -> list[ThreadInfo]:
        threads = self._schema.threads
        query = select(threads).order_by(threads.c.created_at.desc(), threads.c.id.desc())
        if status is not None:
            query = query.where(threads.c.status == status.value)
        if agent is not None:
            query = query.where(threads.c.agent == agent)
        if tag is not None:
            query = query.where(threads.c.tag == tag)
        if before is not None:
            created_at, thread_id = before
            key = tuple_(threads.c.created_at, threads.c.id)
            query = query.where(key < tuple_(as_utc(created_at), thread_id))
        with self._tx() as conn:
            return [thread_info(r) for r in conn.execute(query.limit(limit)).mappings()]

    def set_status(self, thread_id: str, status: ThreadStatus) -> ThreadInfo:
        return self._update_thread(
            thread_id,
            status=status.value,
            failures=0,
            last_error="",
            retry_at=None,
            message_completions=0,
            updated_at=_now(),
        )

    def set_metadata(self, thread_id: str, metadata: dict[str, Any]) -> ThreadInfo:
        changes = {"metadata": dict(metadata), "updated_at": _now()}  # the column's name
        return self._update_thread(thread_id, **changes)

    @retry_busy
    def usage(
        self,
        *,
        thread_id: str | None = None,
        agent: str | None = None,
        since: datetime | None = None,
    ) -> dict[str, Spend]:
        return usage_by_agent(self._schema, self._tx, thread_id, agent, since)

    @retry_busy
    def defer(self, thread_id: str, not_before: datetime, *, seen: int) -> None:
        seen_before = self._schema.threads.c.inbox_seen
        self._update_thread(
            thread_id,
            retry_at=as_utc(not_before),
            inbox_seen=case((seen_before > seen, seen_before), else_=seen),
        )

    def record_failure(
        self, thread_id: str, error: str, stall_after: int, retry_at: datetime | None = None
    ) -> ThreadInfo:
        threads = self._schema.threads
        stalls = threads.c.failures + 1 >= stall_after
        return self._update_thread(
            thread_id,
            failures=threads.c.failures + 1,
            last_error=error,
            retry_at=as_utc(retry_at) if retry_at is not None else None,
            status=case((stalls, ThreadStatus.STALLED.value), else_=threads.c.status),
            updated_at=_now(),
        )

    @retry_busy
    def _update_thread(self, thread_id: str, /, **values: Any) -> ThreadInfo:
        """Change a thread outside a commit; every change moves the version (fencing)."""
        threads = self._schema.threads
        stmt = (
            update(threads)
            .where(threads.c.id == thread_id)
            .values(version=threads.c.version + 1, **values)
            .returning(*threads.c)
        )
        with self._tx(write=True) as conn:
            row = conn.execute(stmt).mappings().first()
        if row is None:
            raise UnknownThread(thread_id)
        return thread_info(row)

    # inbox ---------------------------------------------------------------------------

    @retry_busy
    def enqueue(
        self,
        thread_id: str,
        message_id: str,
        message: Inbound,
        priority: int,
        *,
        max_open: int | None = None,
        answered_ok: bool = True,
        trace: str = "",
    ) -> InboxRow:
        values = inbox_values(thread_id, message_id, message, priority, _now(), trace)
        try:
            if self._postgres and self._caller is None:  # one round trip: sends.py
                self._check_schema_and_say()
                found = insert_checked(
                    self._engine, self._schema, values, message, max_open, answered_ok
                )
                if found is not None:
                    return inbox_row(found)
            with self._tx(write=True, direct=True) as conn:
                rows.check_inbound(conn, thread_id, message_id, message, answered_ok=answered_ok)
                check_room(conn, thread_id, message_id, max_open)
                return inbox_row(run(conn, prepared(conn).insert_inbox, values).one())
        except IntegrityError as exc:
            if is_unique_violation(exc):
                raise DuplicateMessage(thread_id, message_id) from exc
            raise

    @retry_busy
    def add_timer(self, thread_id: str, timer: NewTimer) -> None:
        with self._tx(write=True) as conn:
            rows.get_thread(conn, thread_id)
            rows.insert_timers(conn, thread_id, [timer])

    @retry_busy
    def has_pending_after(
        self, thread_id: str, inbox_id: int, *, user_text_only: bool = False
    ) -> bool:
        with self._tx(direct=True, alone=True) as conn:
            ready = prepared(conn)
            query = ready.user_pending_after if user_text_only else ready.pending_after
            params = {"thread_id": thread_id, "after": inbox_id}
            return run(conn, query, params).first() is not None

    @retry_busy
    def inbox(self, thread_id: str, state: InboxState | None = None) -> list[InboxRow]:
        inbox = self._schema.inbox
        query = select(inbox).where(inbox.c.thread_id == thread_id).order_by(inbox.c.id)
        if state is not None:
            query = query.where(inbox.c.state == state.value)
        with self._tx() as conn:
            found = [inbox_row(r) for r in conn.execute(query).mappings()]
            if not found:
                rows.get_thread(conn, thread_id)
            return found

    # slice ---------------------------------------------------------------------------

    @retry_busy
    def load(self, thread_id: str) -> Snapshot:
        if self._postgres and self._caller is None and self._loads.applies(thread_id):
            with self._tx(direct=True, alone=True) as conn:  # one round trip: loads.py
                found = self._loads.load(conn, thread_id, self._items)
            if found is not None:
                return found
        with self._tx(snapshot=True, direct=True) as conn:
            ready = prepared(conn)
            info = rows.get_thread(conn, thread_id)
            items = visible_history(rows.ConnectionReader(conn, self._items, info), info)
            mine = {"thread_id": thread_id}
            call_rows = run(conn, ready.calls_of, mine).rows
            pending = run(conn, ready.open_inbox, mine).rows
            return Snapshot(
                thread=info,
                items=items,
                calls={r["call_id"]: call_record(r) for r in call_rows},
                inbox=[inbox_row(r) for r in pending],
                next_seq=next_seq(info, items),
            )

    @retry_busy
    def history(self, thread_id: str) -> list[StoredItem]:
        with self._tx(snapshot=True, direct=True) as conn:
            info = rows.get_thread(conn, thread_id)
            return visible_history(rows.ConnectionReader(conn, self._items, info), info)

    @retry_busy
    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]:
        with self._tx(snapshot=True, direct=True) as conn:
            rows.get_thread(conn, thread_id)
            return rows.own_items(conn, thread_id, upto_seq)

    @retry_busy
    def own_items_between(self, thread_id: str, after_seq: int, upto_seq: int) -> list[StoredItem]:
        with self._tx(snapshot=True, direct=True) as conn:
            rows.get_thread(conn, thread_id)
            return rows.own_items_between(conn, thread_id, after_seq, upto_seq)

    @retry_busy
    def children(self, thread_id: str) -> list[ThreadInfo]:
        with self._tx() as conn:
            rows.get_thread(conn, thread_id)
            return rows.children(conn, thread_id)

    @retry_busy
    def call(self, thread_id: str, call_id: str) -> CallRecord:
        # Alone: the second read runs only to say which is unknown, the thread or the call.
        with self._tx(direct=True, alone=True) as conn:
            params = {"thread_id": thread_id, "call_id": call_id}
            row = run(conn, prepared(conn).call, params).first()
            if row is None:
                rows.get_thread(conn, thread_id)
                raise UnknownCall(thread_id, call_id)
            return call_record(row)

    @retry_busy
    def call_trace(self, thread_id: str, call_id: str) -> str:
        outbox = self._schema.outbox
        query = (
            select(outbox.c.trace)
            .where(outbox.c.thread_id == thread_id, outbox.c.call_id == call_id)
            .order_by(outbox.c.id.desc())
            .limit(1)
        )
        with self._tx() as conn:
            found = conn.execute(query).scalar()
        return str(found or "")

    @retry_busy
    def commit(self, commit: Commit) -> list[OutboxRow] | None:
        now = _now()
        if self._postgres and self._caller is None and sent_at_once(commit):  # commits.py
            with self._tx(write=True, direct=True, alone=True) as conn:
                created = commit_at_once(conn, commit, now)
            if created is None:
                self.thread(commit.thread_id)  # UnknownThread if it is gone
            return created
        with self._tx(write=True, direct=plain(commit)) as conn:
            if not rows.advance_thread(conn, commit, now):
                rows.get_thread(conn, commit.thread_id)
                return None
            tid = commit.thread_id
            rows.insert_items(conn, tid, commit.items)
            rows.upsert_calls(conn, tid, commit.calls)
            rows.finish_rows(conn, tid, commit.done, commit.rejected, commit.deferred, commit.trace)
            outbox = [(tid, c, a) for c, a in commit.outbox]
            created = rows.insert_outbox(conn, outbox, now, commit.trace)
            rows.insert_timers(conn, tid, commit.timers)
            rows.cancel_timers(conn, tid, commit.cancel_timers)
            for new in commit.threads:
                rows.create_thread(conn, new, now)
            if commit.close_descendants:
                created += rows.close_descendants(conn, tid, now)
            rows.enqueue_elsewhere(conn, commit.enqueue, now, commit.trace)
            return created

    def mark_dispatched(self, outbox_ids: list[int]) -> None:
        self._stamp_unran(outbox_ids, ran=False)

    def mark_ran(self, outbox_ids: list[int]) -> None:
        self._stamp_unran(outbox_ids, ran=True)

    @retry_busy
    def _stamp_unran(self, outbox_ids: list[int], *, ran: bool) -> None:
        """Stamp ``ran_at`` (or ``dispatched_at``) now on rows no worker has run yet (a ran
        row is final)."""
        if not outbox_ids:
            return
        # Each row's stamp stands alone (a row is stamped or not): no need for one
        # transaction around several.
        with self._tx(write=True, direct=True, alone=True) as conn:
            ready = prepared(conn)
            stmt = ready.mark_ran if ran else ready.mark_dispatched
            now = _now()
            run_many(conn, stmt, [{"row_id": i, "now": now} for i in outbox_ids])

    def close(self) -> None:
        if self._kept is not None:
            self._kept.close()
        self._engine.dispose()
