"""The SQL store's claims: outbox rows stranded before dispatch, tool runs, due timers.

``SQLClaims`` is mixed into ``SQLStore`` (as ``SQLRetention`` is): each method is one short
transaction of the store's own (``_tx``). A running tool task holds its row with a claim
(``claimed_until``) that it renews as its heartbeat; a claim that lapsed means its worker
died, and the sweeper takes the row back with a conditional ``UPDATE`` that only one
sweeper wins.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import UTC, datetime

from sqlalchemy import Connection, and_, or_, select, update

from dormant.messages import InboundAdapter
from dormant.stores.base import InboxRow, OutboxRow, Priority
from dormant.stores.sql import statements as rows
from dormant.stores.sql.direct import run
from dormant.stores.sql.engine import retry_busy
from dormant.stores.sql.prepared import prepared
from dormant.stores.sql.rows import inbox_values, outbox_row
from dormant.stores.sql.tables import Schema, as_utc

__all__ = ["SQLClaims"]


def _now() -> datetime:
    return datetime.now(UTC)


class SQLClaims:
    """Stranded outbox rows and tool-run claims on ``SQLStore``'s tables and transactions."""

    _schema: Schema

    def _tx(
        self,
        *,
        write: bool = False,
        snapshot: bool = False,
        direct: bool = False,
        alone: bool = False,
    ) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    @retry_busy
    def undispatched(
        self, older_than: datetime, limit: int = 100, *, lost_before: datetime | None = None
    ) -> list[OutboxRow]:
        outbox = self._schema.outbox
        # A row that ran is never stranded, even if its dispatch stamp lost the race
        # against the (fast) tool run.
        stranded = and_(
            outbox.c.ran_at.is_(None),
            outbox.c.dispatched_at.is_(None),
            outbox.c.created_at <= as_utc(older_than),
        )
        if lost_before is not None:
            # Dispatched and not started since (or started by a run whose claim lapsed).
            lost = and_(
                outbox.c.ran_at.is_(None),
                outbox.c.dispatched_at <= as_utc(lost_before),
                or_(
                    outbox.c.claimed_until.is_(None),
                    outbox.c.claimed_until <= as_utc(lost_before),
                ),
            )
            stranded = or_(stranded, lost)
        query = (
            select(outbox).where(stranded).order_by(outbox.c.created_at, outbox.c.id).limit(limit)
        )
        with self._tx() as conn:
            return [outbox_row(r) for r in conn.execute(query).mappings()]

    @retry_busy
    def claim_outbox(self, outbox_id: int, until: datetime) -> int:
        """Start a run of the row, held until ``until``: the run's number, or 0 if it ran
        already or a live run holds it (a duplicate task then does nothing)."""
        params = {"row_id": outbox_id, "now": _now(), "until": as_utc(until)}
        with self._tx(write=True, direct=True, alone=True) as conn:
            found = run(conn, prepared(conn).claim_outbox, params).scalars()
            return int(found[0]) if found else 0

    @retry_busy
    def unclaim_outbox(self, outbox_id: int) -> None:
        outbox = self._schema.outbox
        with self._tx(write=True) as conn:
            conn.execute(
                update(outbox)
                .where(outbox.c.id == outbox_id, outbox.c.ran_at.is_(None), outbox.c.runs > 0)
                .values(claimed_until=None, dispatched_at=None, runs=outbox.c.runs - 1)
            )

    @retry_busy
    def renew_outbox_claim(self, outbox_id: int, until: datetime) -> bool:
        """Extend the running task's claim (its heartbeat); False once the row ran."""
        params = {"row_id": outbox_id, "until": as_utc(until)}
        with self._tx(write=True, direct=True, alone=True) as conn:
            return run(conn, prepared(conn).renew_outbox_claim, params).rowcount == 1

    @retry_busy
    def expired_claims(self, now: datetime, limit: int = 100) -> list[OutboxRow]:
        """Rows a run started and stopped renewing (its worker died) that never ran."""
        outbox = self._schema.outbox
        query = (
            select(outbox)
            .where(outbox.c.ran_at.is_(None), outbox.c.claimed_until < as_utc(now))
            .order_by(outbox.c.claimed_until, outbox.c.id)
            .limit(limit)
        )
        with self._tx() as conn:
            return [outbox_row(r) for r in conn.execute(query).mappings()]

    @retry_busy
    def reclaim_outbox(self, outbox_id: int, now: datetime) -> bool:
        """Take back a row whose claim lapsed before ``now``, stamped as dispatched now;
        True for the one sweeper that wins it (it then sends the row again)."""
        outbox = self._schema.outbox
        with self._tx(write=True) as conn:
            taken = conn.execute(
                update(outbox)
                .where(
                    outbox.c.id == outbox_id,
                    outbox.c.ran_at.is_(None),
                    outbox.c.claimed_until < as_utc(now),
                )
                .values(claimed_until=None, dispatched_at=as_utc(now))
            )
            return taken.rowcount == 1

    @retry_busy
    def fire_due_timers(self, now: datetime, limit: int = 100) -> list[InboxRow]:
        """Claim due timers and queue their messages, atomically per claim."""
        now = as_utc(now)
        fired: list[InboxRow] = []
        with self._tx(write=True, direct=True) as conn:
            due = run(conn, prepared(conn).due_timers, {"now": now, "limit": limit})
            for timer in due.rows:
                if not rows.claim_timer(conn, timer["id"], now):
                    continue
                message = InboundAdapter.validate_python(timer["message"])
                values = inbox_values(
                    timer["thread_id"], timer["message_id"], message, Priority.BACKGROUND, now
                )
                row = rows.insert_inbox_ignoring_duplicates(conn, values)
                if row is not None:
                    fired.append(row)
        return fired
