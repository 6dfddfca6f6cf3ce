"""The usage ledger in storage: a database at 0005 upgrades to it, and prune takes a
pruned thread's ledger rows along."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select

from dormant import Agent
from dormant.messages import UserMessage
from dormant.models import ScriptedModel, reply
from dormant.stores.base import NewThread, Store, ThreadStatus
from dormant.stores.sql import SQLStore
from tests.harness import Harness
from tests.test_store_contract import uid


def _upgrade_from_0005(url: str) -> None:
    """Build the database as release 0005 left it, with a waiting thread in it, upgrade,
    and run the thread: its usage is counted from then on."""
    from alembic import command
    from sqlalchemy import MetaData
    from sqlalchemy.engine import make_url

    from dormant.stores.sql.migrate import alembic_config
    from dormant.stores.sql.rows import inbox_values, thread_values
    from dormant.stores.sql.store import SQLStore, make_engine, upgrade

    command.upgrade(alembic_config(make_url(url), ""), "0005")
    thread_id = uid("t")
    now = datetime.now(UTC)
    engine = make_engine(url)
    try:
        old = MetaData()
        old.reflect(engine, only=["threads", "inbox"])
        threads, inbox = old.tables["threads"], old.tables["inbox"]
        assert "tree_tokens" not in threads.c
        thread = thread_values(NewThread(id=thread_id, agent="a"), now)
        message = inbox_values(thread_id, uid("m"), UserMessage(text="before the upgrade"), 8, now)
        with engine.begin() as conn:
            conn.execute(threads.insert(), {k: v for k, v in thread.items() if k in threads.c})
            conn.execute(inbox.insert(), message)
    finally:
        engine.dispose()
    upgrade(url)
    store = SQLStore(url)
    try:
        before = store.thread(thread_id)
        assert (before.tree_tokens, before.tree_cost, before.message_completions) == (0, 0.0, 0)
        model = ScriptedModel(lambda _items: reply("after the upgrade"), name="gpt-4.1-mini")
        h = Harness(Agent("a", model=model), store=store)
        h.step(thread_id)
        after = store.thread(thread_id)
        assert after.tree_tokens > 0 and after.message_completions == 1
        assert store.usage(thread_id=thread_id)["a"].completions == 1
    finally:
        store.close()


def test_a_sqlite_database_at_0005_upgrades_to_the_usage_ledger(tmp_path: Path) -> None:
    _upgrade_from_0005(f"sqlite:///{tmp_path}/old.db")


def test_a_postgres_database_at_0005_upgrades_to_the_usage_ledger() -> None:
    from tests.conftest import _unavailable
    from tests.databases import empty_database

    with empty_database("dormant_upgrade_ledger", _unavailable) as url:
        _upgrade_from_0005(url)


def test_prune_deletes_the_ledger_rows_of_the_threads_it_deletes(store: Store) -> None:
    model = ScriptedModel(lambda _items: reply("hi"), name="gpt-4.1-mini")
    h = Harness(Agent("a", model=model), store=store)
    gone, kept = h.launch("a", "one"), h.launch("a", "two")
    h.step(gone)
    h.step(kept)
    assert h.store.usage()["a"].completions == 2
    h.close_thread(gone)
    assert h.store.thread(gone).status is ThreadStatus.CLOSED
    store.prune_batch(datetime.now(UTC) + timedelta(seconds=1), limit=100)
    assert h.store.usage()["a"].completions == 1
    assert h.store.usage(thread_id=kept)["a"].completions == 1
    if isinstance(store, SQLStore):  # no orphan rows hidden by the join with threads
        ledger = store._schema.ledger
        with store._engine.connect() as conn:
            query = select(func.count()).select_from(ledger).where(ledger.c.thread_id == gone)
            assert conn.execute(query).scalar_one() == 0
