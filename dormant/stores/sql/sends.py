"""A send on PostgreSQL in one round trip: every check of an enqueue in its ``INSERT``.

An enqueue in a transaction of its own is ``BEGIN``, the thread read ``FOR SHARE`` (against
a concurrent close), a read for a message id seen before, one for the inbox's depth, the
``INSERT`` and ``COMMIT``: six round trips to the server, on the path of every ``send``
and ``deliver`` before its wake. Here the same checks are the condition of one
``INSERT ... SELECT`` run alone (autocommit): the thread's row is locked ``FOR SHARE`` in
the statement, and a close that committed meanwhile is seen in it (PostgreSQL checks a
locked row's condition again on its newest version). The statement only ever inserts a
row the full checks would have accepted; when it inserts nothing, the caller runs the
full checks (``statements.check_inbound``, ``retention.check_room``), which say why the
message is refused, or store it if what refused it changed meanwhile.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Engine, Insert, Select, and_, bindparam, exists, func, or_, select

from dormant.messages import Inbound, UserMessage
from dormant.stores.base import CallState, ThreadStatus
from dormant.stores.digest import message_digest
from dormant.stores.sql.direct import direct_transaction, run
from dormant.stores.sql.prepared import is_open
from dormant.stores.sql.rows import SCHEMA_OPTION
from dormant.stores.sql.tables import Schema, schema

__all__ = ["insert_checked"]

_COLUMNS = (
    "thread_id",
    "message_id",
    "kind",
    "payload",
    "priority",
    "state",
    "reason",
    "trace",
)
_STAMP = "created_at"


class CheckedInserts:
    """The checked ``INSERT`` of one schema, by (for a call, may its call be answered,
    is the inbox's depth limited)."""

    def __init__(self, t: Schema) -> None:
        self._t = t
        self.statements: dict[tuple[bool, bool, bool], Insert] = {
            (for_call, answered_ok, limited): self._build(for_call, answered_ok, limited)
            for for_call in (False, True)
            for answered_ok in (False, True)
            for limited in (False, True)
        }

    def _target(self, for_call: bool, answered_ok: bool) -> Select[Any]:
        """The thread's row, locked ``FOR SHARE``, if it takes the message: open, and for a
        result or an event, its call known, not cancelled, and (unless ``answered_ok``)
        without its result unless it is a subscription."""
        threads, calls = self._t.threads, self._t.calls
        is_open_thread = and_(
            threads.c.id == bindparam("thread_id"), threads.c.status != ThreadStatus.CLOSED.value
        )
        if not for_call:
            return select(threads.c.id).where(is_open_thread).with_for_update(read=True)
        its_call = and_(calls.c.thread_id == threads.c.id, calls.c.call_id == bindparam("call_id"))
        takes = [calls.c.state != CallState.CANCELLED.value]
        if not answered_ok:
            takes.append(or_(calls.c.state != CallState.ANSWERED.value, calls.c.subscription))
        return (
            select(threads.c.id)
            .join(calls, its_call)
            .where(is_open_thread, *takes)
            .with_for_update(read=True, of=threads)
        )

    def _build(self, for_call: bool, answered_ok: bool, limited: bool) -> Insert:
        t = self._t
        items, pruned, inbox = t.items, t.pruned_ids, t.inbox
        mine = inbox.c.thread_id == bindparam("thread_id")
        target = self._target(for_call, answered_ok).cte("target")
        unseen = [
            ~exists().where(
                items.c.thread_id == bindparam("thread_id"),
                items.c.message_id == bindparam("message_id"),
            ),
            ~exists().where(
                pruned.c.thread_id == bindparam("thread_id"),
                pruned.c.digest == bindparam("digest", type_=pruned.c.digest.type),
            ),
        ]
        if limited:
            waiting = select(inbox.c.id).where(mine, is_open(inbox)).limit(bindparam("max_open"))
            depth = select(func.count()).select_from(waiting.subquery()).scalar_subquery()
            unseen.append(depth < bindparam("max_open"))
        names = (*_COLUMNS, _STAMP)
        values = [bindparam(name, type_=inbox.c[name].type) for name in names]
        source = select(*values).select_from(target).where(*unseen)
        return inbox.insert().from_select(list(names), source).returning(*inbox.c)


@functools.cache
def _inserts(prefix: str) -> CheckedInserts:
    return CheckedInserts(schema(prefix))


def insert_checked(
    engine: Engine,
    t: Schema,
    values: dict[str, Any],
    message: Inbound,
    max_open: int | None,
    answered_ok: bool,
) -> dict[str, Any] | None:
    """Insert the inbox row ``values`` if every check of an enqueue passes, in one
    statement run alone on a pooled connection of ``engine`` (PostgreSQL); the new row, or
    None when it was not inserted (a unique violation on the message id raises
    ``IntegrityError``, as the plain ``INSERT`` does)."""
    params = {**values, "digest": message_digest(values["message_id"])}
    for_call = not isinstance(message, UserMessage)
    if not isinstance(message, UserMessage):
        params["call_id"] = message.call_id
    key = (for_call, answered_ok, max_open is not None)
    stmt = _inserts(t.prefix).statements[key]
    if max_open is not None:
        params["max_open"] = max_open
    options = {SCHEMA_OPTION: t}
    with direct_transaction(engine, options, begin=None, snapshot=False, alone=True) as conn:
        return run(conn, stmt, params).first()
