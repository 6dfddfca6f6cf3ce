"""Every store keeps a row's trace context (``dormant.tracing``): memory, SQLite, PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dormant.messages import UserMessage
from dormant.stores.base import InboxState, NewThread, Priority, Store, ThreadStatus
from tests.test_store_contract import commit_from, new_thread, uid

CONTEXT = "00-0000000000000000000000000000abcd-00000000000000ef-01 1700000000000"


def test_an_enqueued_row_keeps_the_senders_trace_context(store: Store) -> None:
    thread = new_thread(store)
    store.enqueue(thread.id, uid("m"), UserMessage(text="hi"), Priority.INTERACTIVE, trace=CONTEXT)
    store.enqueue(thread.id, uid("m"), UserMessage(text="untraced"), Priority.INTERACTIVE)
    assert [row.trace for row in store.load(thread.id).inbox] == [CONTEXT, ""]


def test_a_launch_keeps_the_trace_context_with_its_first_message(store: Store) -> None:
    first = (uid("m"), UserMessage(text="hi"), Priority.INTERACTIVE)
    thread = new_thread(store, messages=[first], trace=CONTEXT)
    assert [row.trace for row in store.load(thread.id).inbox] == [CONTEXT]


def test_a_commit_stores_its_trace_context_with_its_outbox_rows_and_messages_out(
    store: Store,
) -> None:
    thread = new_thread(store)
    other = new_thread(store)
    note = (other.id, uid("m"), UserMessage(text="from a sibling"), Priority.BACKGROUND)
    commit = commit_from(
        store.load(thread.id),
        status=ThreadStatus.WAITING,
        outbox=[("call_1", "tool")],
        enqueue=[note],
        trace=CONTEXT,
    )
    rows = store.commit(commit)
    assert rows is not None and [r.trace for r in rows] == [CONTEXT]
    later = datetime.now(UTC) + timedelta(minutes=1)
    assert [r.trace for r in store.undispatched(later)] == [CONTEXT]  # the sweeper's re-dispatch
    assert [row.trace for row in store.load(other.id).inbox] == [CONTEXT]


def test_a_child_thread_created_by_a_commit_keeps_its_seeds_context(store: Store) -> None:
    parent = new_thread(store)
    child_id = uid("child")
    seed = (uid("seed"), UserMessage(text="go"), Priority.BACKGROUND)
    child = NewThread(id=child_id, agent="triage", parent_id=parent.id, messages=[seed])
    commit = commit_from(
        store.load(parent.id), status=ThreadStatus.IDLE, threads=[child], trace=CONTEXT
    )
    assert store.commit(commit) is not None
    assert [row.trace for row in store.load(child_id).inbox] == [""]


def test_an_applied_row_keeps_the_context_of_the_slice_that_applied_it(store: Store) -> None:
    thread = new_thread(store)
    applied = store.enqueue(thread.id, uid("m"), UserMessage(text="a"), 8, trace=CONTEXT)
    untraced = store.enqueue(thread.id, uid("m"), UserMessage(text="b"), 8, trace=CONTEXT)
    slice_context = "00-000000000000000000000000000000aa-00000000000000bb-01 1700000000001"
    snap = store.load(thread.id)
    assert store.commit(commit_from(snap, done=[applied.id], trace=slice_context)) is not None
    snap = store.load(thread.id)
    assert store.commit(commit_from(snap, done=[untraced.id])) is not None
    done = {row.id: row.trace for row in store.inbox(thread.id, InboxState.DONE)}
    assert done == {applied.id: slice_context, untraced.id: CONTEXT}
