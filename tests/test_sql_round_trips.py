"""A slice's load and commit on PostgreSQL in one and two round trips (``stores/sql/loads.py``,
``commits.py``): the load reads what the load one statement at a time reads, and falls back
to it where it cannot serve (a thread with ancestors, a history cache entry that changed
under the read); the commit's statements, bound by the driver, store exactly what they
were given."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.exc import IntegrityError

from dormant.errors import UnknownThread
from dormant.messages import AssistantTurn, UserMessage, UserText
from dormant.stores.base import Commit, NewThread, Snapshot, StoredItem, ThreadStatus
from dormant.stores.sql.items import ItemCache
from dormant.stores.sql.store import SQLStore


@pytest.fixture
def store(postgres_url: str) -> Iterator[SQLStore]:
    opened = SQLStore(postgres_url)
    yield opened
    opened.close()


def _id() -> str:
    return f"t_{secrets.token_hex(6)}"


def _said(seq: int, text: str) -> StoredItem:
    return StoredItem(seq=seq, message_id=f"m{seq}", item=UserText(text=text))


def _answer(store: SQLStore, snap: Snapshot, text: str) -> None:
    item = StoredItem(
        seq=snap.next_seq, message_id=f"a{snap.next_seq}", item=AssistantTurn(text=text)
    )
    commit = Commit(
        thread_id=snap.thread.id,
        version=snap.thread.version,
        status=ThreadStatus.IDLE,
        inbox_seen=max((r.id for r in snap.inbox), default=snap.thread.inbox_seen),
        items=[item],
        done=[r.id for r in snap.inbox],
    )
    assert store.commit(commit) is not None


def _read_one_at_a_time(store: SQLStore, thread_id: str) -> Snapshot:
    """The same load on a store that never loads in one round trip."""
    store._loads.applies = lambda _thread_id: False  # type: ignore[method-assign]
    return store.load(thread_id)


def test_a_load_reads_the_thread_its_items_calls_and_open_inbox_in_one_round_trip(
    store: SQLStore, postgres_url: str
) -> None:
    tid = _id()
    store.create_thread(NewThread(id=tid, agent="a", messages=[("m0", UserMessage(text="hi"), 8)]))
    first = store.load(tid)
    assert [r.message_id for r in first.inbox] == ["m0"] and first.items == []
    _answer(store, first, "hello")
    store.enqueue(tid, "m1", UserMessage(text="again"), 8)
    snap = store.load(tid)  # the cached items, then the new one
    assert [s.item for s in snap.items] == [AssistantTurn(text="hello")]
    assert [r.message_id for r in snap.inbox] == ["m1"]
    other = SQLStore(postgres_url)
    try:
        assert snap == _read_one_at_a_time(other, tid)
    finally:
        other.close()
    with pytest.raises(UnknownThread):
        store.load(_id())


def test_a_child_reads_its_parents_items_and_is_then_loaded_the_usual_way(
    store: SQLStore,
) -> None:
    parent, child = _id(), _id()
    store.create_thread(NewThread(id=parent, agent="a", items=[_said(1, "one"), _said(2, "two")]))
    store.create_thread(NewThread(id=child, agent="a", parent_id=parent, fork_seq=1))
    for _ in range(2):
        snap = store.load(child)
        assert [s.seq for s in snap.items] == [1]
        assert not store._loads.applies(child)
    assert store._loads.applies(parent)


def test_a_cache_entry_that_changed_under_the_read_is_read_again(
    store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid = _id()
    store.create_thread(NewThread(id=tid, agent="a", items=[_said(1, "one"), _said(2, "two")]))
    assert [s.seq for s in store.load(tid).items] == [1, 2]  # cached up to seq 2
    # The read asks for the items after seq 1, as if another slice's read of the entry
    # had ended at seq 1 when it was sent.
    monkeypatch.setattr(ItemCache, "last_seq", lambda self, thread_id: 1)
    assert [s.seq for s in store.load(tid).items] == [1, 2]


def test_a_commit_sent_at_once_stores_any_text_exactly_and_its_outbox_rows_in_order(
    store: SQLStore,
) -> None:
    tid = _id()
    store.create_thread(NewThread(id=tid, agent="a", messages=[("m0", UserMessage(text="x"), 8)]))
    snap = store.load(tid)
    text = 'it\'s 100% \\ done; %s %(x)s $1 \\x00ff "q" -- é ☃ 𝄞 ;COMMIT; ROLLBACK'
    items = [StoredItem(seq=snap.next_seq, message_id=f"a;'{tid}", item=AssistantTurn(text=text))]
    commit = Commit(
        thread_id=tid,
        version=snap.thread.version,
        status=ThreadStatus.WAITING,
        inbox_seen=snap.inbox[0].id,
        items=items,
        done=[snap.inbox[0].id],
        outbox=[("c1", "tool"), ("c2'", "tool"), ("c3", "cancel")],
    )
    created = store.commit(commit)
    assert created is not None
    assert [(r.call_id, r.action) for r in created] == [
        ("c1", "tool"),
        ("c2'", "tool"),
        ("c3", "cancel"),
    ]
    assert [r.id for r in created] == sorted(r.id for r in created)
    after = store.load(tid)
    assert after.items == items and after.inbox == []
    assert store.history(tid) == items
    assert store.commit(commit) is None  # the version moved: nothing written
    assert store.history(tid) == items


def test_a_commit_failing_after_its_guard_writes_nothing_and_quotes_no_text(
    store: SQLStore,
) -> None:
    tid = _id()
    store.create_thread(NewThread(id=tid, agent="a", items=[_said(1, "one")]))
    store.enqueue(tid, "in1", UserMessage(text="x"), 8)
    snap = store.load(tid)
    clash = StoredItem(seq=1, message_id="again", item=AssistantTurn(text="secret words"))
    commit = Commit(
        thread_id=tid,
        version=snap.thread.version,
        status=ThreadStatus.WAITING,
        inbox_seen=snap.inbox[0].id,
        items=[clash],  # seq 1 is taken: the second message fails
        done=[snap.inbox[0].id],
        outbox=[("c1", "tool")],
    )
    with pytest.raises(IntegrityError) as raised:
        store.commit(commit)
    assert tid in str(raised.value) and "secret words" not in str(raised.value)
    after = store.load(tid)
    assert after.thread.version == snap.thread.version
    assert after.inbox == snap.inbox and after.items == snap.items
    waiting = store.undispatched(datetime.now(UTC) + timedelta(days=1))
    assert [row for row in waiting if row.thread_id == tid] == []


def _prepared_loads(store: SQLStore) -> list[str]:
    """The load's statements prepared on the store's one pooled connection (the tests
    load from one thread, so the pool lends the same connection every time)."""
    raw = store._engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'dormant_load_%%'")
        return sorted(row[0] for row in cursor.fetchall())
    finally:
        raw.close()


def test_a_load_runs_its_reads_prepared_once_on_its_connection(store: SQLStore) -> None:
    tid = _id()
    store.create_thread(NewThread(id=tid, agent="a", messages=[("m0", UserMessage(text="hi"), 8)]))
    first = store.load(tid)
    prepared = _prepared_loads(store)
    assert len(prepared) == 4  # the thread, its items, its calls, its open inbox
    assert store.load(tid) == first
    text = "it's 100% done; COMMIT; \\ \U0001f600"
    _answer(store, first, text)
    again = store.load(tid)
    assert [s.item for s in again.items] == [AssistantTurn(text=text)]
    assert again == _read_one_at_a_time(store, tid)
    assert set(prepared) <= set(_prepared_loads(store))


def test_a_connection_that_lost_its_prepared_reads_loads_as_text_from_then_on(
    store: SQLStore,
) -> None:
    tid = _id()
    store.create_thread(NewThread(id=tid, agent="a", messages=[("m0", UserMessage(text="hi"), 8)]))
    first = store.load(tid)
    raw = store._engine.raw_connection()  # what DISCARD ALL or a PgBouncer does to it
    try:
        raw.cursor().execute("DEALLOCATE ALL")
        raw.commit()
    finally:
        raw.close()
    assert store.load(tid) == first
    assert store.load(tid) == first
    assert _prepared_loads(store) == []


def test_a_read_prepared_on_the_session_by_someone_else_is_used_as_it_is(
    store: SQLStore,
) -> None:
    tid = _id()
    store.create_thread(NewThread(id=tid, agent="a", messages=[("m0", UserMessage(text="hi"), 8)]))
    first = store.load(tid)
    fairy = store._engine.raw_connection()  # a PgBouncer's server connection, say
    try:
        fairy.info.clear()  # this client has not prepared them; the session has
    finally:
        fairy.close()
    assert store.load(tid) == first
    assert len(_prepared_loads(store)) == 4
