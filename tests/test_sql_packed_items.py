"""The SQL store keeps each item's JSON packed (migration 0010), reads the rows written
before it from their JSON, and its downgrade gives every packed row its JSON back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import MetaData, select
from sqlalchemy.engine import make_url

from dormant import Agent
from dormant.messages import AssistantTurn, ItemAdapter, UserMessage, UserText
from dormant.models import ScriptedModel, reply
from dormant.models.simulated import simulated_text
from dormant.stores.base import NewThread, StoredItem
from dormant.stores.rawitem import RawStoredItem
from dormant.stores.sql import SQLStore, make_engine, upgrade
from dormant.stores.sql.rows import inbox_values, thread_values
from tests.harness import Harness
from tests.test_store_contract import uid

LONG_TEXT = simulated_text(1200, 7, "packed")


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a database with no tables yet."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'items.db'}"
        return
    from tests.conftest import _unavailable
    from tests.databases import empty_database

    with empty_database("dormant_packed", _unavailable) as url:
        yield url


def _migrate(url: str, revision: str, *, down: bool = False) -> None:
    from alembic import command

    from dormant.stores.sql.migrate import alembic_config

    config = alembic_config(make_url(url), "")
    (command.downgrade if down else command.upgrade)(config, revision)


def _item_rows(url: str, thread_id: str) -> list[dict[str, object]]:
    """The thread's item rows as the database holds them, whatever the schema's version."""
    engine = make_engine(url)
    try:
        now = MetaData()
        now.reflect(engine, only=["items"])
        items = now.tables["items"]
        query = select(items).where(items.c.thread_id == thread_id).order_by(items.c.seq)
        with engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]
    finally:
        engine.dispose()


def _run_one_turn(store: SQLStore, thread_id: str) -> None:
    model = ScriptedModel(lambda _items: reply(LONG_TEXT), name="gpt-4.1-mini")
    Harness(Agent("a", model=model), store=store).step(thread_id)


def test_an_item_is_stored_packed_in_well_under_its_json_and_reads_back_equal(
    empty_url: str,
) -> None:
    upgrade(empty_url)
    store = SQLStore(empty_url)
    try:
        thread_id = store.create_thread(NewThread(id=uid("t"), agent="a")).id
        store.enqueue(thread_id, uid("m"), UserMessage(text="write at length"), 8)
        _run_one_turn(store, thread_id)
        history = store.load(thread_id).items
    finally:
        store.close()
    assert [s.item for s in history] == [
        UserText(text="write at length"),
        AssistantTurn(text=LONG_TEXT),
    ]
    assert all(type(s) is RawStoredItem for s in history)  # decoded only when read
    rows = _item_rows(empty_url, thread_id)
    assert [r["data"] for r in rows] == [None, None]
    long_json = ItemAdapter.dump_json(AssistantTurn(text=LONG_TEXT))
    packed = rows[1]["packed"]
    assert isinstance(packed, bytes) and len(packed) < 0.65 * len(long_json)


def _write_before_0010(url: str) -> tuple[str, list[StoredItem]]:
    """A thread with two items, written as release 0009 wrote them (JSON in ``data``)."""
    _migrate(url, "0009")
    thread_id = uid("t")
    old_items = [
        StoredItem(1, uid("m"), UserText(text='before the upgrade: é, "quoted"\n')),
        StoredItem(2, "turn:2:ab", AssistantTurn(text=LONG_TEXT)),
    ]
    engine = make_engine(url)
    try:
        old = MetaData()
        old.reflect(engine, only=["threads", "items", "inbox"])
        threads, items, inbox = old.tables["threads"], old.tables["items"], old.tables["inbox"]
        assert "packed" not in items.c
        thread = thread_values(NewThread(id=thread_id, agent="a"), datetime.now(UTC))
        message = UserMessage(text="and after it")
        with engine.begin() as conn:
            conn.execute(threads.insert(), {k: v for k, v in thread.items() if k in threads.c})
            for stored in old_items:
                row = {
                    "thread_id": thread_id,
                    "seq": stored.seq,
                    "kind": stored.item.kind,
                    "data": ItemAdapter.dump_python(stored.item, mode="json"),
                    "message_id": stored.message_id,
                }
                conn.execute(items.insert(), row)
            conn.execute(
                inbox.insert(), inbox_values(thread_id, uid("m"), message, 8, thread["created_at"])
            )
    finally:
        engine.dispose()
    return thread_id, old_items


def test_items_written_before_0010_read_back_and_the_downgrade_unpacks_the_later_ones(
    empty_url: str,
) -> None:
    thread_id, old_items = _write_before_0010(empty_url)
    upgrade(empty_url)
    store = SQLStore(empty_url)
    try:
        _run_one_turn(store, thread_id)  # the model reads the old items, the turn is packed
        history = [s.item for s in store.load(thread_id).items]
    finally:
        store.close()
    expected = [
        *(s.item for s in old_items),
        UserText(text="and after it"),
        AssistantTurn(text=LONG_TEXT),
    ]
    assert history == expected
    rows = _item_rows(empty_url, thread_id)
    assert [r["packed"] is None for r in rows] == [True, True, False, False]

    _migrate(empty_url, "0009", down=True)
    rows = _item_rows(empty_url, thread_id)
    assert "packed" not in rows[0]
    assert [ItemAdapter.validate_python(r["data"]) for r in rows] == expected
    assert json.loads(ItemAdapter.dump_json(expected[3])) == rows[3]["data"]

    upgrade(empty_url)
    store = SQLStore(empty_url)
    try:
        assert [s.item for s in store.load(thread_id).items] == expected
    finally:
        store.close()
