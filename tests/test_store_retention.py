"""The store contract for quarantine, inbox depth and pruning, on every backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dormant.errors import DuplicateMessage, InboxFull, UnknownThread
from dormant.messages import UserMessage, UserText
from dormant.ops.prune import parse_age, prune
from dormant.stores.base import (
    RETRIED_MARK,
    InboxState,
    NewThread,
    PruneCounts,
    Store,
    StoredItem,
    ThreadStatus,
)
from tests.test_store_contract import commit_from, enqueue, new_thread, uid


def soon() -> datetime:
    """A cutoff just ahead of now: everything written so far is older than it."""
    return datetime.now(UTC) + timedelta(seconds=1)


def consume(store: Store, thread_id: str, status: ThreadStatus = ThreadStatus.IDLE) -> None:
    """Apply every open row as a slice would: each user text becomes an item."""
    snap = store.load(thread_id)
    items = [
        StoredItem(snap.next_seq + n, row.message_id, UserText(text="seen"))
        for n, row in enumerate(snap.inbox)
    ]
    commit = commit_from(snap, status=status, items=items, done=[r.id for r in snap.inbox])
    assert store.commit(commit) is not None


def test_a_quarantined_row_is_set_aside_listed_and_released_by_retry(store: Store) -> None:
    t = new_thread(store).id
    poison = enqueue(store, t, "poison")
    fine = enqueue(store, t, "fine")
    store.record_failure(t, "KeyError: 'x'", stall_after=5, retry_at=soon())
    info = store.quarantine(t, poison.id, "quarantined after 3 failed slices: KeyError: 'x'")
    assert info.failures == 0 and info.retry_at is None
    assert [r.id for r in store.load(t).inbox] == [fine.id]
    (row,) = store.inbox(t, InboxState.QUARANTINED)
    assert row.id == poison.id and "KeyError" in row.reason
    assert [r.id for r in store.quarantined()] == [poison.id]
    assert store.threads_to_wake(now=datetime.now(UTC)) == [t]
    consume(store, t)
    assert store.threads_to_wake(now=datetime.now(UTC)) == []  # quarantine wakes nothing
    (released,) = store.release_quarantined(t)
    assert released.state is InboxState.PENDING and released.reason.startswith(RETRIED_MARK)
    assert store.quarantined() == [] and store.threads_to_wake() == [t]
    consume(store, t)
    (done,) = [r for r in store.inbox(t) if r.id == poison.id]
    assert done.state is InboxState.DONE and done.reason.startswith(RETRIED_MARK)


def test_release_of_one_message_leaves_the_others_quarantined(store: Store) -> None:
    t = new_thread(store).id
    a, b = enqueue(store, t, "a"), enqueue(store, t, "b")
    store.quarantine(t, a.id, "bad")
    store.quarantine(t, b.id, "bad too")
    assert [r.id for r in store.release_quarantined(t, b.message_id)] == [b.id]
    assert [r.id for r in store.quarantined()] == [a.id]
    assert store.release_quarantined(t, "nothing-like-it") == []
    with pytest.raises(UnknownThread):
        store.release_quarantined("no-such-thread")


def test_enqueue_refuses_past_max_open_and_counts_only_waiting_rows(store: Store) -> None:
    t = new_thread(store).id
    first = enqueue(store, t, "1")
    store.enqueue(t, uid("m"), UserMessage(text="2"), 8, max_open=2)
    with pytest.raises(InboxFull):
        store.enqueue(t, uid("m"), UserMessage(text="3"), 8, max_open=2)
    store.quarantine(t, first.id, "bad")  # set aside: no longer waiting
    store.enqueue(t, uid("m"), UserMessage(text="3"), 8, max_open=2)


def test_a_message_id_in_the_history_stays_a_duplicate_after_its_row_is_pruned(
    store: Store,
) -> None:
    t = new_thread(store).id
    row = enqueue(store, t, "hello", message_id="m-1")
    consume(store, t)
    counts = prune(store, soon(), batch=10)
    assert counts.inbox >= 1 and all(r.id != row.id for r in store.inbox(t))
    with pytest.raises(DuplicateMessage):
        enqueue(store, t, "hello", message_id="m-1")


def test_prune_deletes_closed_trees_and_finished_rows_and_keeps_live_work(store: Store) -> None:
    closed = new_thread(store).id
    child = store.create_thread(
        NewThread(id=uid("child"), agent="triage", parent_id=closed, fork_seq=0, root_id=closed)
    ).id
    for thread_id in (child, closed):
        enqueue(store, thread_id, "bye")
        consume(store, thread_id, ThreadStatus.CLOSED)
    live = new_thread(store).id
    enqueue(store, live, "old and done")
    consume(store, live)
    waiting = enqueue(store, live, "still waiting")

    assert prune(store, datetime.now(UTC) - timedelta(days=30), batch=10) == PruneCounts()
    dry = prune(store, soon(), batch=1, dry_run=True)
    assert dry.threads == 2 and dry.inbox >= 1
    store.thread(closed)  # a dry run deletes nothing

    batches: list[PruneCounts] = []
    total = prune(store, soon(), batch=1, on_batch=batches.append)
    # The rows of the trees deleted count as deleted (two), as in the dry run.
    assert total == dry == PruneCounts(threads=2, inbox=3)
    assert batches == [total]  # batch=1: one tree (two threads), one finished row
    for gone in (closed, child):
        with pytest.raises(UnknownThread, match="pruned"):
            store.thread(gone)
        with pytest.raises(UnknownThread):
            enqueue(store, gone, "anyone there?")
    assert [r.id for r in store.inbox(live)] == [waiting.id]
    assert store.thread(live).status is ThreadStatus.IDLE
    assert prune(store, soon(), batch=10) == PruneCounts()


def test_an_open_descendant_keeps_its_closed_root_from_being_pruned(store: Store) -> None:
    root = new_thread(store).id
    store.create_thread(
        NewThread(id=uid("child"), agent="triage", parent_id=root, fork_seq=0, root_id=root)
    )
    enqueue(store, root, "bye")
    consume(store, root, ThreadStatus.CLOSED)
    assert prune(store, soon(), batch=10).threads == 0
    assert store.thread(root).status is ThreadStatus.CLOSED


def test_ages_parse_with_their_units() -> None:
    assert parse_age("30d") == timedelta(days=30)
    assert parse_age("1.5h") == timedelta(minutes=90)
    assert parse_age("2w") == timedelta(days=14)
    with pytest.raises(Exception, match="not an age"):
        parse_age("30 days")


def _upgrade_from_0001(url: str) -> None:
    """Build the database as release 0001 left it, with a thread in it, then upgrade. The
    old rows are written with the 0001 tables as they are in the database (reflected):
    today's store writes columns a later migration adds."""
    from alembic import command
    from sqlalchemy import MetaData
    from sqlalchemy.engine import make_url

    from dormant.stores.sql.migrate import alembic_config
    from dormant.stores.sql.rows import inbox_values, thread_values
    from dormant.stores.sql.store import SQLStore, make_engine, upgrade

    command.upgrade(alembic_config(make_url(url), ""), "0001")
    thread_id = uid("t")
    now = datetime.now(UTC)
    engine = make_engine(url)
    try:
        old = MetaData()
        old.reflect(engine, only=["threads", "inbox"])
        threads, inbox = old.tables["threads"], old.tables["inbox"]
        thread = thread_values(NewThread(id=thread_id, agent="triage"), now)
        message = inbox_values(thread_id, uid("m"), UserMessage(text="before the upgrade"), 8, now)
        with engine.begin() as conn:
            conn.execute(threads.insert(), {k: v for k, v in thread.items() if k in threads.c})
            conn.execute(inbox.insert(), message)
    finally:
        engine.dispose()
    upgrade(url)
    store = SQLStore(url)
    try:
        (row,) = store.inbox(thread_id)
        store.quarantine(thread_id, row.id, "bad")
        assert [r.id for r in store.quarantined()] == [row.id]
        assert store.thread(thread_id).closed_reason == ""
    finally:
        store.close()


def test_an_existing_sqlite_database_upgrades_to_the_retention_indexes(tmp_path: Path) -> None:
    _upgrade_from_0001(f"sqlite:///{tmp_path}/old.db")


def test_an_existing_postgres_database_upgrades_to_the_retention_indexes() -> None:
    from tests.conftest import _unavailable
    from tests.databases import empty_database

    with empty_database("dormant_upgrade", _unavailable) as url:
        _upgrade_from_0001(url)
