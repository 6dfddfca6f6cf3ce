"""A send on PostgreSQL is one statement (``dormant/stores/sql/sends.py``), with the rules
of the full checks: what it refuses, the full checks refuse with their reason."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from dormant.errors import (
    CallAnswered,
    DuplicateMessage,
    InboxFull,
    SubscriptionCancelled,
    ThreadClosed,
    UnknownCall,
    UnknownThread,
)
from dormant.messages import EventMessage, ToolResultMessage, UserMessage
from dormant.stores.base import CallRecord, CallState, NewThread, Priority
from dormant.stores.sql.store import SQLStore
from tests.conftest import _truncate_postgres


@pytest.fixture
def pg(postgres_url: str) -> Iterator[SQLStore]:
    _truncate_postgres(postgres_url)
    store = SQLStore(postgres_url)
    calls = [
        CallRecord("pending", "build", {}, 1, CallState.PENDING),
        CallRecord("answered", "build", {}, 1, CallState.ANSWERED),
        CallRecord("feed", "watch", {}, 1, CallState.ANSWERED, subscription=True),
        CallRecord("cancelled", "watch", {}, 1, CallState.CANCELLED, subscription=True),
    ]
    store.create_thread(NewThread(id="t1", agent="a", calls=calls))
    yield store
    store.close()


def _no_transaction(*_: Any, **__: Any) -> Any:
    raise AssertionError("a transaction of several statements")


def test_an_accepted_send_result_or_event_is_one_statement(
    pg: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SQLStore, "_tx", _no_transaction)
    user = pg.enqueue("t1", "m1", UserMessage(text="hi"), Priority.INTERACTIVE, max_open=5)
    result = ToolResultMessage(call_id="pending", content="ok")
    answer = pg.enqueue("t1", "m2", result, Priority.BACKGROUND, answered_ok=False)
    event = EventMessage(call_id="feed", content="tick")
    tick = pg.enqueue("t1", "m3", event, Priority.BACKGROUND, max_open=5, answered_ok=False)
    assert [row.message_id for row in (user, answer, tick)] == ["m1", "m2", "m3"]
    assert [row.message for row in (user, answer, tick)] == [
        UserMessage(text="hi"),
        result,
        event,
    ]


def test_what_the_one_statement_refuses_is_refused_with_its_reason(pg: SQLStore) -> None:
    hi = UserMessage(text="hi")
    pg.enqueue("t1", "m1", hi, Priority.INTERACTIVE)
    with pytest.raises(DuplicateMessage):
        pg.enqueue("t1", "m1", hi, Priority.INTERACTIVE)
    with pytest.raises(InboxFull):
        pg.enqueue("t1", "m2", hi, Priority.INTERACTIVE, max_open=1)
    with pytest.raises(UnknownThread):
        pg.enqueue("nope", "m3", hi, Priority.INTERACTIVE)
    late = ToolResultMessage(call_id="answered", content="again")
    with pytest.raises(CallAnswered):
        pg.enqueue("t1", "m4", late, Priority.BACKGROUND, answered_ok=False)
    pg.enqueue("t1", "m5", late, Priority.BACKGROUND, answered_ok=True)
    with pytest.raises(UnknownCall):
        pg.enqueue("t1", "m6", ToolResultMessage(call_id="x", content=""), Priority.BACKGROUND)
    with pytest.raises(SubscriptionCancelled):
        pg.enqueue("t1", "m7", EventMessage(call_id="cancelled", content=""), 0)


def test_a_close_committed_while_a_send_waits_for_the_thread_refuses_the_send(
    pg: SQLStore, postgres_url: str
) -> None:
    closer = create_engine(make_url(postgres_url).set(drivername="postgresql+psycopg"))
    outcome: list[BaseException | str] = []

    def send() -> None:
        try:
            pg.enqueue("t1", "m1", UserMessage(text="hi"), Priority.INTERACTIVE)
            outcome.append("stored")
        except BaseException as error:
            outcome.append(error)

    try:
        with closer.begin() as conn:
            conn.execute(text("UPDATE threads SET status = 'closed' WHERE id = 't1'"))
            sender = threading.Thread(target=send)
            sender.start()
            sender.join(0.5)
            assert sender.is_alive(), "the send waited for the closing transaction"
        sender.join(30)
    finally:
        closer.dispose()
    assert len(outcome) == 1 and isinstance(outcome[0], ThreadClosed)
