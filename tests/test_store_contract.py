"""The ``Store`` contract, run against every backend (memory, SQLite file, PostgreSQL)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from dormant.errors import (
    CallAnswered,
    DuplicateMessage,
    SubscriptionCancelled,
    ThreadClosed,
    UnknownCall,
    UnknownThread,
)
from dormant.messages import (
    AssistantTurn,
    ChildReport,
    EventMessage,
    EventShown,
    Inbound,
    ParentMessage,
    Summary,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    Usage,
    UserMessage,
    UserText,
)
from dormant.stores.base import (
    CallRecord,
    CallState,
    Commit,
    InboxState,
    NewThread,
    NewTimer,
    Priority,
    Snapshot,
    Store,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
)
from dormant.stores.sql.store import VERSION_TABLE, SQLStore, make_engine, upgrade
from dormant.stores.sql.tables import metadata

StoreOpener = Callable[[], Store]
PAST = datetime(2020, 1, 1, tzinfo=UTC)


# Helpers -----------------------------------------------------------------------------


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def new_thread(store: Store, **fields: Any) -> ThreadInfo:
    fields.setdefault("id", uid("t"))
    fields.setdefault("agent", "triage")
    return store.create_thread(NewThread(**fields))


def record(call_id: str, state: CallState = CallState.PENDING, **fields: Any) -> CallRecord:
    fields.setdefault("name", "get_build_status")
    fields.setdefault("args", {"build_id": "42"})
    fields.setdefault("seq", 1)
    return CallRecord(call_id=call_id, state=state, **fields)


def commit_from(snap: Snapshot, **fields: Any) -> Commit:
    """A commit on top of ``snap``: same version, status WAITING unless told."""
    fields.setdefault("status", ThreadStatus.WAITING)
    fields.setdefault("inbox_seen", snap.thread.inbox_seen)
    return Commit(thread_id=snap.thread.id, version=snap.thread.version, **fields)


def with_calls(store: Store, thread_id: str, *calls: CallRecord) -> Snapshot:
    """Record calls as a turn would, and return the thread as it is now."""
    assert store.commit(commit_from(store.load(thread_id), calls=list(calls))) is not None
    return store.load(thread_id)


def enqueue(store: Store, thread_id: str, text: str = "hello", **kw: Any) -> Any:
    message_id = kw.pop("message_id", uid("m"))
    priority = kw.pop("priority", Priority.INTERACTIVE)
    return store.enqueue(thread_id, message_id, UserMessage(text=text), priority)


def timer(call_id: str, due_at: datetime, message_id: str | None = None) -> NewTimer:
    message = ToolResultMessage(call_id=call_id, content="slept")
    return NewTimer(
        call_id=call_id, due_at=due_at, message_id=message_id or uid("timer"), message=message
    )


def is_utc(value: datetime | None) -> bool:
    return value is not None and value.utcoffset() == timedelta(0)


EVERY_ITEM = [
    UserText(text="Is build 42 green yet? ünïcödé ✓"),
    AssistantTurn(
        text="Let me check.",
        calls=(
            ToolCall(call_id="c1", name="get_build_status", args={"build_id": "42", "n": [1, 2.5]}),
            ToolCall(call_id="c2", name="watch", args={"nested": {"deep": None, "flag": True}}),
        ),
    ),
    AssistantTurn(),
    ToolResult(call_id="c1", name="get_build_status", content="green", is_error=False),
    ToolResult(call_id="c2", name="watch", content="boom", is_error=True),
    EventShown(
        call_id="evt_1",
        original_call_id="c2",
        original_name="watch",
        original_args={"repo": "a/b"},
        content="PR #7 opened",
    ),
    Summary(text="The user asked about build 42.", upto_seq=3),
]

EVERY_INBOUND: list[Inbound] = [
    UserMessage(text="hi ✓"),
    ToolResultMessage(call_id="c1", content="green", is_error=True),
    EventMessage(call_id="c1", content="PR opened", associative=True, final=True),
    ChildReport(call_id="c1", child_thread_id="child-1", content="done"),
    ParentMessage(call_id="c1", content="also check 43"),
]


# Threads -----------------------------------------------------------------------------


def test_a_new_thread_is_idle_at_version_zero_and_is_its_own_root(store: Store) -> None:
    info = new_thread(store, id="t-1", metadata={"user": "ada"})

    assert (info.id, info.agent, info.status, info.version) == ("t-1", "triage", "idle", 0)
    assert (info.root_id, info.failures, info.last_error, info.inbox_seen) == ("t-1", 0, "", 0)
    assert info.metadata == {"user": "ada"}
    assert info.usage == Usage()
    assert store.thread("t-1") == info


def test_a_child_thread_keeps_its_parent_fork_point_and_root(store: Store) -> None:
    parent = new_thread(store)
    child = new_thread(
        store, parent_id=parent.id, parent_call_id="c1", fork_seq=4, root_id=parent.id
    )

    assert (child.parent_id, child.parent_call_id, child.fork_seq) == (parent.id, "c1", 4)
    assert child.root_id == parent.id
    assert store.thread(child.id) == child


def test_creating_a_thread_twice_raises_duplicate_message(store: Store) -> None:
    first = new_thread(store, id="t-dup")

    with pytest.raises(DuplicateMessage) as raised:
        new_thread(store, id="t-dup", agent="other")

    assert (raised.value.thread_id, raised.value.message_id) == ("t-dup", "t-dup")
    assert store.thread("t-dup") == first


def test_thread_timestamps_are_aware_utc(store: Store) -> None:
    info = new_thread(store)

    assert is_utc(info.created_at) and is_utc(info.updated_at)
    assert is_utc(store.thread(info.id).created_at)


@pytest.mark.parametrize(
    "use",
    [
        lambda s: s.thread("nope"),
        lambda s: s.load("nope"),
        lambda s: s.history("nope"),
        lambda s: s.own_items("nope"),
        lambda s: s.children("nope"),
        lambda s: s.inbox("nope"),
        lambda s: s.call("nope", "c1"),
        lambda s: s.set_status("nope", ThreadStatus.IDLE),
        lambda s: s.record_failure("nope", "boom", 3),
        lambda s: s.add_timer("nope", timer("c1", PAST)),
        lambda s: s.commit(Commit("nope", 0, ThreadStatus.IDLE, 0)),
    ],
    ids=[
        "thread",
        "load",
        "history",
        "own_items",
        "children",
        "inbox",
        "call",
        "set_status",
        "record_failure",
        "add_timer",
        "commit",
    ],
)
def test_an_unknown_thread_raises_unknown_thread_naming_it(
    store: Store, use: Callable[[Store], object]
) -> None:
    with pytest.raises(UnknownThread) as raised:
        use(store)

    assert raised.value.thread_id == "nope"
    assert "nope" in str(raised.value)


def test_threads_lists_newest_first_filtered_by_status_and_limited(store: Store) -> None:
    made = [new_thread(store) for _ in range(4)]
    store.set_status(made[1].id, ThreadStatus.CLOSED)
    newest_first = sorted(made, key=lambda t: (t.created_at, t.id), reverse=True)

    assert [t.id for t in store.threads()] == [t.id for t in newest_first]
    assert [t.id for t in store.threads(limit=2)] == [t.id for t in newest_first[:2]]
    assert [t.id for t in store.threads(status=ThreadStatus.CLOSED)] == [made[1].id]
    assert store.threads(status=ThreadStatus.STALLED) == []


def test_threads_page_by_keyset_filtered_by_agent_and_status(store: Store) -> None:
    made = [new_thread(store, agent="triage" if i % 3 else "billing") for i in range(9)]
    store.set_status(made[4].id, ThreadStatus.STALLED)
    newest_first = sorted(made, key=lambda t: (t.created_at, t.id), reverse=True)

    pages: list[list[str]] = []
    before: tuple[datetime, str] | None = None
    while page := store.threads(limit=4, before=before):
        pages.append([t.id for t in page])
        before = (page[-1].created_at, page[-1].id)
    triage = store.threads(agent="triage")
    stalled_triage = store.threads(ThreadStatus.STALLED, agent="triage")

    assert [len(p) for p in pages] == [4, 4, 1]
    assert [i for p in pages for i in p] == [t.id for t in newest_first]
    assert [t.id for t in triage] == [t.id for t in newest_first if t.agent == "triage"]
    assert [t.id for t in stalled_triage] == [made[4].id]
    after_first = store.threads(agent="billing", before=(triage[0].created_at, triage[0].id))
    billing = [t for t in newest_first if t.agent == "billing"]
    assert [t.id for t in after_first] == [
        t.id for t in billing if (t.created_at, t.id) < (triage[0].created_at, triage[0].id)
    ]


def test_set_status_resets_failures_and_moves_the_version(store: Store) -> None:
    info = new_thread(store)
    store.record_failure(info.id, "rate limited", stall_after=1)

    after = store.set_status(info.id, ThreadStatus.IDLE)

    assert (after.status, after.failures, after.last_error, after.version) == ("idle", 0, "", 2)
    assert store.thread(info.id) == after


def test_record_failure_counts_and_stalls_the_thread_at_the_threshold(store: Store) -> None:
    info = new_thread(store)

    first = store.record_failure(info.id, "timeout", stall_after=2)
    second = store.record_failure(info.id, "rate limited", stall_after=2)

    assert (first.failures, first.status, first.last_error, first.version) == (
        1,
        "idle",
        "timeout",
        1,
    )
    assert (second.failures, second.status, second.last_error, second.version) == (
        2,
        "stalled",
        "rate limited",
        2,
    )
    assert store.thread(info.id) == second


def test_a_commit_clears_the_failure_count(store: Store) -> None:
    info = new_thread(store)
    store.record_failure(info.id, "timeout", stall_after=5)

    store.commit(commit_from(store.load(info.id), status=ThreadStatus.IDLE))

    after = store.thread(info.id)
    assert (after.failures, after.last_error) == (0, "")


# Enqueue -----------------------------------------------------------------------------


def test_enqueue_returns_a_pending_row_that_load_and_inbox_show(store: Store) -> None:
    info = new_thread(store)

    row = store.enqueue(info.id, "m-1", UserMessage(text="hi"), Priority.INTERACTIVE)

    assert (row.thread_id, row.message_id, row.state, row.reason) == (info.id, "m-1", "pending", "")
    assert row.message == UserMessage(text="hi")
    assert row.priority == Priority.INTERACTIVE
    assert is_utc(row.created_at)
    assert store.load(info.id).inbox == [row]
    assert store.inbox(info.id) == [row]
    assert store.inbox(info.id, InboxState.PENDING) == [row]


def test_every_inbound_kind_round_trips_exactly(store: Store) -> None:
    info = new_thread(store)
    with_calls(store, info.id, record("c1", CallState.SUBSCRIBED, subscription=True))

    rows = [store.enqueue(info.id, uid("m"), m, Priority.BACKGROUND) for m in EVERY_INBOUND]

    assert [r.message for r in store.load(info.id).inbox] == EVERY_INBOUND
    assert store.inbox(info.id) == rows


def test_inbox_ids_grow_across_threads(store: Store) -> None:
    a, b = new_thread(store), new_thread(store)

    ids = [enqueue(store, t.id).id for t in (a, b, a, b)]

    assert ids == sorted(ids) and len(set(ids)) == 4


def test_a_repeated_message_id_raises_duplicate_message_and_stores_nothing(store: Store) -> None:
    info = new_thread(store)
    first = store.enqueue(info.id, "m-1", UserMessage(text="once"), Priority.INTERACTIVE)

    with pytest.raises(DuplicateMessage) as raised:
        store.enqueue(info.id, "m-1", UserMessage(text="twice"), Priority.INTERACTIVE)

    assert (raised.value.thread_id, raised.value.message_id) == (info.id, "m-1")
    assert store.inbox(info.id) == [first]


def test_a_message_id_stays_taken_after_its_row_is_done(store: Store) -> None:
    info = new_thread(store)
    row = enqueue(store, info.id, message_id="m-1")
    store.commit(commit_from(store.load(info.id), done=[row.id], inbox_seen=row.id))

    with pytest.raises(DuplicateMessage):
        enqueue(store, info.id, message_id="m-1")


def test_the_same_message_id_may_reach_two_threads(store: Store) -> None:
    a, b = new_thread(store), new_thread(store)

    enqueue(store, a.id, message_id="shared")
    enqueue(store, b.id, message_id="shared")

    assert len(store.inbox(a.id)) == len(store.inbox(b.id)) == 1


def test_concurrent_enqueues_of_one_message_id_store_it_once(open_store: StoreOpener) -> None:
    stores = [open_store() for _ in range(4)]
    info = new_thread(stores[0])
    barrier = threading.Barrier(len(stores))

    def send(store: Store) -> str:
        barrier.wait()
        try:
            enqueue(store, info.id, message_id="m-race")
        except DuplicateMessage:
            return "duplicate"
        return "stored"

    with ThreadPoolExecutor(len(stores)) as pool:
        outcomes = sorted(pool.map(send, stores))

    assert outcomes == ["duplicate"] * (len(stores) - 1) + ["stored"]
    assert len(stores[0].inbox(info.id)) == 1


def test_enqueue_to_an_unknown_thread_raises_unknown_thread(store: Store) -> None:
    with pytest.raises(UnknownThread) as raised:
        enqueue(store, "ghost")

    assert raised.value.thread_id == "ghost"


def test_enqueue_to_a_closed_thread_raises_thread_closed_and_stores_nothing(store: Store) -> None:
    info = new_thread(store)
    store.set_status(info.id, ThreadStatus.CLOSED)

    with pytest.raises(ThreadClosed) as raised:
        enqueue(store, info.id)

    assert raised.value.thread_id == info.id and info.id in raised.value.reason
    assert store.inbox(info.id) == []


@pytest.mark.parametrize("message", EVERY_INBOUND[1:], ids=lambda m: m.kind)
def test_enqueue_for_an_unknown_call_raises_unknown_call_and_stores_nothing(
    store: Store, message: Inbound
) -> None:
    info = new_thread(store)
    with_calls(store, info.id, record("other"))

    with pytest.raises(UnknownCall) as raised:
        store.enqueue(info.id, "m-1", message, Priority.BACKGROUND)

    assert (raised.value.thread_id, raised.value.call_id) == (info.id, "c1")
    assert store.inbox(info.id) == []


@pytest.mark.parametrize("message", EVERY_INBOUND[1:], ids=lambda m: m.kind)
def test_enqueue_on_a_cancelled_subscription_raises_and_stores_nothing(
    store: Store, message: Inbound
) -> None:
    info = new_thread(store)
    with_calls(store, info.id, record("c1", CallState.CANCELLED, subscription=True))

    with pytest.raises(SubscriptionCancelled) as raised:
        store.enqueue(info.id, "m-1", message, Priority.BACKGROUND)

    assert (raised.value.thread_id, raised.value.call_id) == (info.id, "c1")
    assert store.inbox(info.id) == []


@pytest.mark.parametrize(
    "state", [CallState.PENDING, CallState.ANSWERED, CallState.INTERRUPTED, CallState.SUBSCRIBED]
)
def test_enqueue_for_a_live_or_answered_call_is_accepted(store: Store, state: CallState) -> None:
    info = new_thread(store)
    with_calls(store, info.id, record("c1", state))

    row = store.enqueue(
        info.id, "m-1", ToolResultMessage(call_id="c1", content="ok"), Priority.BACKGROUND
    )

    assert store.inbox(info.id) == [row]


def test_a_result_for_an_answered_call_is_refused_when_asked(store: Store) -> None:
    info = new_thread(store)
    with_calls(
        store,
        info.id,
        record("c1", CallState.ANSWERED),
        record("c2", CallState.ANSWERED, subscription=True),
    )
    first = ToolResultMessage(call_id="c1", content="ok")
    store.enqueue(info.id, "m-1", first, Priority.BACKGROUND)  # answered_ok by default

    with pytest.raises(DuplicateMessage):
        store.enqueue(info.id, "m-1", first, Priority.BACKGROUND, answered_ok=False)
    with pytest.raises(CallAnswered) as raised:
        store.enqueue(info.id, "m-2", first, Priority.BACKGROUND, answered_ok=False)
    event = ToolResultMessage(call_id="c2", content="later")
    store.enqueue(info.id, "m-3", event, Priority.BACKGROUND, answered_ok=False)

    assert (raised.value.call_id, raised.value.message_id) == ("c1", "m-2")
    assert [r.message_id for r in store.inbox(info.id)] == ["m-1", "m-3"]


def test_a_thread_is_created_with_its_first_messages_or_not_at_all(store: Store) -> None:
    first = ("launch:t", UserMessage(text="hi"), Priority.INTERACTIVE)
    info = new_thread(store, messages=[first])
    assert [(r.message_id, r.message, r.priority, r.state) for r in store.inbox(info.id)] == [
        (*first, InboxState.PENDING)
    ]
    assert [r.message_id for r in store.load(info.id).inbox] == ["launch:t"]

    again = ("launch:t2", UserMessage(text="hi again"), Priority.INTERACTIVE)
    with pytest.raises(DuplicateMessage):
        new_thread(store, id=info.id, messages=[again])
    assert [r.message_id for r in store.inbox(info.id)] == ["launch:t"]


# Load and history --------------------------------------------------------------------


def test_a_new_thread_loads_empty_with_next_seq_one(store: Store) -> None:
    info = new_thread(store)

    snap = store.load(info.id)

    assert (snap.thread, snap.items, snap.calls, snap.inbox, snap.next_seq) == (info, [], {}, [], 1)


def test_a_child_without_items_continues_after_its_fork_point(store: Store) -> None:
    child = new_thread(store, parent_id=new_thread(store).id, fork_seq=7)

    assert store.load(child.id).next_seq == 8


def test_next_seq_follows_the_last_own_item(store: Store) -> None:
    child = new_thread(store, fork_seq=7)
    items = [StoredItem(8, "m-8", UserText(text="a")), StoredItem(9, "m-9", UserText(text="b"))]
    store.commit(commit_from(store.load(child.id), items=items))

    assert store.load(child.id).next_seq == 10


def test_every_item_kind_round_trips_exactly_in_seq_order(store: Store) -> None:
    info = new_thread(store)
    stored = [StoredItem(seq, f"m-{seq}", item) for seq, item in enumerate(EVERY_ITEM, 1)]

    store.commit(commit_from(store.load(info.id), items=stored[:3]))
    store.commit(commit_from(store.load(info.id), items=stored[3:]))

    assert store.own_items(info.id) == stored
    assert store.own_items(info.id, upto_seq=3) == stored[:3]
    assert store.load(info.id).next_seq == len(stored) + 1


def test_history_starts_at_the_latest_summary(store: Store) -> None:
    info = new_thread(store)
    texts = [StoredItem(n, f"m-{n}", UserText(text=str(n))) for n in (1, 2, 3)]
    summary = StoredItem(4, "sum-1", Summary(text="1 and 2", upto_seq=2))
    after = StoredItem(5, "m-5", UserText(text="5"))

    store.commit(commit_from(store.load(info.id), items=[*texts, summary, after]))

    assert store.history(info.id) == [summary, texts[2], after]
    assert store.load(info.id).items == store.history(info.id)


def test_a_child_sees_its_parents_history_up_to_the_fork_then_its_own(store: Store) -> None:
    parent = new_thread(store)
    mine = [StoredItem(n, f"p-{n}", UserText(text=f"parent {n}")) for n in (1, 2, 3, 4)]
    store.commit(commit_from(store.load(parent.id), items=mine))
    child = new_thread(store, parent_id=parent.id, parent_call_id="c1", fork_seq=2)
    grandchild = new_thread(store, parent_id=child.id, fork_seq=3)
    own = StoredItem(3, "c-3", UserText(text="child 3"))
    store.commit(commit_from(store.load(child.id), items=[own]))
    store.commit(commit_from(store.load(grandchild.id), items=[]))

    assert store.history(child.id) == [*mine[:2], own]
    assert store.own_items(child.id) == [own]
    assert store.load(child.id).next_seq == 4
    assert store.history(grandchild.id) == [*mine[:2], own]
    assert store.load(grandchild.id).next_seq == 4


def test_a_new_thread_starts_with_the_items_and_calls_it_is_given(store: Store) -> None:
    parent = new_thread(store)
    seed = StoredItem(3, "seed-1", UserText(text="go"))
    spawn = record("c1", CallState.ANSWERED, name="spawn_thread")
    child = NewThread(
        id=uid("child"),
        agent="helper",
        parent_id=parent.id,
        fork_seq=2,
        items=[seed],
        calls=[spawn],
    )
    direct = new_thread(store, items=[StoredItem(1, "d-1", UserText(text="hi"))])

    store.commit(commit_from(store.load(parent.id), threads=[child]))

    assert store.own_items(child.id) == [seed]
    assert store.load(child.id).calls == {"c1": spawn}
    assert store.load(child.id).next_seq == 4
    assert [s.message_id for s in store.own_items(direct.id)] == ["d-1"]


def test_wakes_due_carry_the_highest_priority_of_each_threads_pending_rows(
    store: Store,
) -> None:
    mixed, background = new_thread(store), new_thread(store)
    store.enqueue(mixed.id, "m-1", UserMessage(text="a"), Priority.BACKGROUND)
    store.enqueue(mixed.id, "m-2", UserMessage(text="b"), Priority.INTERACTIVE)
    store.enqueue(background.id, "b-1", UserMessage(text="c"), Priority.BACKGROUND)

    assert store.wakes_due() == [
        (mixed.id, Priority.INTERACTIVE),
        (background.id, Priority.BACKGROUND),
    ]
    assert store.threads_to_wake() == [mixed.id, background.id]


def test_children_are_listed_oldest_first(store: Store) -> None:
    parent = new_thread(store)
    kids = [new_thread(store, parent_id=parent.id, fork_seq=0) for _ in range(3)]
    new_thread(store, parent_id=kids[0].id, fork_seq=0)

    oldest_first = sorted(kids, key=lambda t: (t.created_at, t.id))
    assert [t.id for t in store.children(parent.id)] == [t.id for t in oldest_first]
    assert store.children(kids[1].id) == []


def test_closing_a_thread_closes_its_descendants_and_cancels_their_subscriptions(
    store: Store,
) -> None:
    root = new_thread(store)
    child = new_thread(store, parent_id=root.id, fork_seq=0)
    done = new_thread(store, parent_id=root.id, fork_seq=0)
    grandchild = new_thread(store, parent_id=done.id, fork_seq=0)
    with_calls(
        store,
        child.id,
        record("watch", CallState.SUBSCRIBED, subscription=True),
        record("wait", CallState.PENDING, subscription=True, seq=2),
        record("over", CallState.CANCELLED, subscription=True, seq=3),
        record("plain", CallState.PENDING, seq=4),
    )
    with_calls(store, grandchild.id, record("feed", CallState.SUBSCRIBED, subscription=True))
    # an event thread's copy of the subscription it inherited: the subscriber's to stop
    event = new_thread(store, parent_id=root.id, fork_seq=5)
    with_calls(store, event.id, record("sub", CallState.SUBSCRIBED, subscription=True, seq=5))
    store.set_status(done.id, ThreadStatus.CLOSED)
    closed_version = store.thread(done.id).version

    outbox = store.commit(
        commit_from(store.load(root.id), status=ThreadStatus.CLOSED, close_descendants=True)
    )

    assert outbox is not None
    assert sorted((r.thread_id, r.call_id, r.action) for r in outbox) == sorted(
        [
            (child.id, "watch", "cancel"),
            (child.id, "wait", "cancel"),
            (grandchild.id, "feed", "cancel"),
        ]
    )
    assert all(
        store.thread(t.id).status == "closed" for t in (root, child, done, grandchild, event)
    )
    assert store.thread(done.id).version == closed_version
    states = {c.call_id: c.state for c in store.load(child.id).calls.values()}
    assert states == {
        "watch": "cancelled",
        "wait": "cancelled",
        "over": "cancelled",
        "plain": "answered",
    }
    # the calls still pending are answered, so the closed history stays well formed
    answered = [(s.seq, s.item) for s in store.own_items(child.id)]
    assert [(seq, item.call_id) for seq, item in answered] == [(1, "wait"), (2, "plain")]  # type: ignore[union-attr]
    assert all(
        isinstance(item, ToolResult) and "was closed first" in item.content for _, item in answered
    )
    assert store.call(grandchild.id, "feed").state == "cancelled"
    assert store.call(event.id, "sub").state == "cancelled"
    assert store.own_items(event.id) == []  # nothing of its own was pending


def test_items_without_a_message_id_may_share_the_empty_id(store: Store) -> None:
    info = new_thread(store)
    items = [StoredItem(1, "", AssistantTurn(text="a")), StoredItem(2, "", AssistantTurn(text="b"))]

    store.commit(commit_from(store.load(info.id), items=items))

    assert store.history(info.id) == items


def test_load_shows_only_pending_rows_in_inbox_order(store: Store) -> None:
    info = new_thread(store)
    rows = [enqueue(store, info.id, str(n)) for n in range(4)]
    store.commit(
        commit_from(store.load(info.id), done=[rows[0].id], rejected=[(rows[2].id, "malformed")])
    )

    assert [r.id for r in store.load(info.id).inbox] == [rows[1].id, rows[3].id]


def test_call_returns_the_record_or_raises_unknown_call(store: Store) -> None:
    info = new_thread(store)
    with_calls(store, info.id, record("c1", subscription=True, passive=True))

    assert store.call(info.id, "c1") == record("c1", subscription=True, passive=True)
    with pytest.raises(UnknownCall) as raised:
        store.call(info.id, "c9")
    assert (raised.value.thread_id, raised.value.call_id) == (info.id, "c9")


# Commit ------------------------------------------------------------------------------


def test_a_commit_writes_everything_and_moves_the_version(store: Store) -> None:
    info, other = new_thread(store), new_thread(store)
    done_row, bad_row = enqueue(store, info.id, "a"), enqueue(store, info.id, "b")
    snap = store.load(info.id)
    turn = AssistantTurn(text="checking", calls=(ToolCall(call_id="c1", name="get_build_status"),))
    child = NewThread(
        id=uid("child"), agent="helper", parent_id=info.id, parent_call_id="c2", fork_seq=2
    )
    seed = ("child-seed", UserMessage(text="go"), Priority.BACKGROUND)
    usage = Usage(input_tokens=120, output_tokens=30, cached_tokens=100)

    outbox = store.commit(
        commit_from(
            snap,
            items=[StoredItem(1, "m-a", UserText(text="a")), StoredItem(2, "turn-1", turn)],
            calls=[record("c1", seq=2), record("c2", name="spawn_thread", seq=2)],
            done=[done_row.id],
            rejected=[(bad_row.id, "malformed payload")],
            outbox=[("c1", "tool"), ("c2", "spawn")],
            timers=[timer("c3", PAST + timedelta(days=1), "wake-1")],
            threads=[child],
            enqueue=[(child.id, *seed), (other.id, "note", UserMessage(text="fyi"), 4)],
            inbox_seen=bad_row.id,
            usage=usage,
        )
    )

    assert outbox is not None
    assert [(r.thread_id, r.call_id, r.action, r.dispatched_at) for r in outbox] == [
        (info.id, "c1", "tool", None),
        (info.id, "c2", "spawn", None),
    ]
    assert all(is_utc(r.created_at) for r in outbox) and outbox[0].id < outbox[1].id
    after = store.load(info.id)
    assert (after.thread.version, after.thread.status) == (1, "waiting")
    assert (after.thread.inbox_seen, after.thread.usage) == (bad_row.id, usage)
    assert after.thread.updated_at >= info.updated_at
    assert [s.item for s in after.items] == [UserText(text="a"), turn]
    assert set(after.calls) == {"c1", "c2"} and after.inbox == []
    assert [(r.state, r.reason) for r in store.inbox(info.id)] == [
        ("done", ""),
        ("rejected", "malformed payload"),
    ]
    assert store.next_timer_due() == PAST + timedelta(days=1)
    made = store.thread(child.id)
    assert (made.parent_id, made.parent_call_id, made.fork_seq, made.root_id) == (
        info.id,
        "c2",
        2,
        child.id,
    )
    assert [(r.message_id, r.message, r.priority) for r in store.inbox(child.id)] == [seed]
    assert [r.message for r in store.inbox(other.id)] == [UserMessage(text="fyi")]


def test_a_second_commit_from_the_same_snapshot_returns_none_and_writes_nothing(
    store: Store,
) -> None:
    info = new_thread(store)
    row = enqueue(store, info.id)
    snap = store.load(info.id)
    first = commit_from(
        snap,
        items=[StoredItem(1, "m-1", UserText(text="first"))],
        calls=[record("c1")],
        done=[row.id],
        outbox=[("c1", "tool")],
    )
    stale = commit_from(
        snap,
        items=[StoredItem(1, "m-x", UserText(text="stale"))],
        calls=[record("c9")],
        rejected=[(row.id, "stale")],
        outbox=[("c9", "tool")],
        timers=[timer("c9", PAST)],
        threads=[NewThread(id="never", agent="a")],
        status=ThreadStatus.CLOSED,
        enqueue=[(info.id, "never", UserMessage(text="x"), 4)],
    )

    assert store.commit(first) is not None
    before = store.load(info.id)
    assert store.commit(stale) is None

    assert store.load(info.id) == before
    assert store.inbox(info.id)[0].state == "done"
    assert [r.call_id for r in store.undispatched(datetime.now(UTC) + timedelta(1))] == ["c1"]
    assert store.next_timer_due() is None
    assert [t.id for t in store.threads()] == [info.id]


def test_concurrent_commits_from_one_snapshot_let_exactly_one_win(
    open_store: StoreOpener,
) -> None:
    stores = [open_store() for _ in range(4)]
    info = new_thread(stores[0])
    snap = stores[0].load(info.id)
    barrier = threading.Barrier(len(stores))

    def write(n: int) -> bool:
        barrier.wait()
        items = [StoredItem(1, f"m-{n}", UserText(text=str(n)))]
        return stores[n].commit(commit_from(snap, items=items)) is not None

    with ThreadPoolExecutor(len(stores)) as pool:
        won = list(pool.map(write, range(len(stores))))

    assert won.count(True) == 1
    assert len(stores[0].history(info.id)) == 1 and stores[0].thread(info.id).version == 1


def test_a_failing_commit_writes_nothing(store: Store) -> None:
    info, taken = new_thread(store), new_thread(store)
    row = enqueue(store, info.id)
    snap = store.load(info.id)

    with pytest.raises(DuplicateMessage):
        store.commit(
            commit_from(
                snap,
                items=[StoredItem(1, "m-1", UserText(text="x"))],
                done=[row.id],
                outbox=[("c1", "tool")],
                threads=[NewThread(id=taken.id, agent="again")],
            )
        )

    assert store.load(info.id) == snap
    assert store.undispatched(datetime.now(UTC) + timedelta(1)) == []


def test_calls_are_upserted_by_call_id(store: Store) -> None:
    info = new_thread(store)
    with_calls(store, info.id, record("c1"), record("c2"))

    snap = with_calls(store, info.id, record("c1", CallState.SUBSCRIBED, subscription=True))

    assert snap.calls == {
        "c1": record("c1", CallState.SUBSCRIBED, subscription=True),
        "c2": record("c2"),
    }


def test_done_and_rejected_only_finish_pending_rows(store: Store) -> None:
    info = new_thread(store)
    row = enqueue(store, info.id)
    store.commit(commit_from(store.load(info.id), rejected=[(row.id, "first reason")]))

    store.commit(commit_from(store.load(info.id), done=[row.id]))
    store.commit(commit_from(store.load(info.id), rejected=[(row.id, "second reason")]))

    assert [(r.state, r.reason) for r in store.inbox(info.id)] == [("rejected", "first reason")]


def test_one_commit_gives_each_row_its_own_fate_and_reason(store: Store) -> None:
    info = new_thread(store)
    rows = [enqueue(store, info.id, str(n)) for n in range(5)]
    store.commit(
        commit_from(
            store.load(info.id),
            done=[rows[0].id, rows[3].id],
            deferred=[rows[1].id],
            rejected=[(rows[2].id, "closed call"), (rows[4].id, "malformed")],
        )
    )

    assert [(r.state, r.reason) for r in store.inbox(info.id)] == [
        ("done", ""),
        ("deferred", ""),
        ("rejected", "closed call"),
        ("done", ""),
        ("rejected", "malformed"),
    ]


def test_inbox_seen_never_goes_back_and_usage_stays_when_not_given(store: Store) -> None:
    info = new_thread(store)
    usage = Usage(input_tokens=5)
    store.commit(commit_from(store.load(info.id), inbox_seen=10, usage=usage))

    store.commit(commit_from(store.load(info.id), inbox_seen=3))

    after = store.thread(info.id)
    assert (after.inbox_seen, after.usage, after.version) == (10, usage, 2)


def test_a_commit_ignores_messages_another_thread_already_has(store: Store) -> None:
    info, other = new_thread(store), new_thread(store)
    first = enqueue(store, other.id, "original", message_id="report-1")

    outbox = store.commit(
        commit_from(
            store.load(info.id), enqueue=[(other.id, "report-1", UserMessage(text="again"), 4)]
        )
    )

    assert outbox == []
    assert store.inbox(other.id) == [first]


def test_a_commit_ignores_repeated_timers_and_cancels_unfired_ones(store: Store) -> None:
    info = new_thread(store)
    soon, later = PAST + timedelta(hours=1), PAST + timedelta(hours=2)
    store.commit(
        commit_from(
            store.load(info.id), timers=[timer("c1", soon, "w-1"), timer("c2", later, "w-2")]
        )
    )
    store.commit(commit_from(store.load(info.id), timers=[timer("c1", PAST, "w-1")]))
    assert store.next_timer_due() == soon

    store.commit(commit_from(store.load(info.id), cancel_timers=["c1"]))

    assert store.next_timer_due() == later
    assert [r.message_id for r in store.fire_due_timers(later)] == ["w-2"]


# Outbox ------------------------------------------------------------------------------


def test_undispatched_lists_old_enough_rows_oldest_first_until_dispatched(store: Store) -> None:
    info = new_thread(store)
    first = store.commit(commit_from(store.load(info.id), outbox=[("c1", "tool")]))
    second = store.commit(commit_from(store.load(info.id), outbox=[("c2", "tool"), ("c3", "tool")]))
    assert first is not None and second is not None
    everything = datetime.now(UTC) + timedelta(seconds=1)

    assert store.undispatched(everything) == first + second
    assert store.undispatched(everything, limit=2) == first + second[:1]
    assert store.undispatched(first[0].created_at - timedelta(seconds=1)) == []

    store.mark_dispatched([first[0].id, second[1].id])
    store.mark_dispatched([first[0].id])
    store.mark_dispatched([])

    assert store.undispatched(everything) == second[:1]


# Timers ------------------------------------------------------------------------------


def test_a_due_timer_fires_once_as_a_background_inbox_row(store: Store) -> None:
    info = new_thread(store)
    due = timer("c1", PAST, "wake-c1")
    store.add_timer(info.id, due)
    store.add_timer(info.id, timer("c2", datetime.now(UTC) + timedelta(days=1)))

    fired = store.fire_due_timers(datetime.now(UTC))
    again = store.fire_due_timers(datetime.now(UTC))

    assert [(r.thread_id, r.message_id, r.message, r.priority, r.state) for r in fired] == [
        (info.id, "wake-c1", due.message, Priority.BACKGROUND, "pending")
    ]
    assert again == []
    assert store.load(info.id).inbox == fired


def test_timers_fire_in_due_order_up_to_the_limit(store: Store) -> None:
    info = new_thread(store)
    for minutes in (3, 1, 2):
        store.add_timer(
            info.id, timer(f"c{minutes}", PAST + timedelta(minutes=minutes), f"w-{minutes}")
        )

    first = store.fire_due_timers(datetime.now(UTC), limit=2)
    rest = store.fire_due_timers(datetime.now(UTC), limit=2)

    assert [r.message_id for r in first] == ["w-1", "w-2"]
    assert [r.message_id for r in rest] == ["w-3"]


def test_a_repeated_timer_is_ignored(store: Store) -> None:
    info = new_thread(store)
    store.add_timer(info.id, timer("c1", PAST + timedelta(hours=1), "w-1"))
    store.add_timer(info.id, timer("c1", PAST, "w-1"))

    assert store.next_timer_due() == PAST + timedelta(hours=1)
    assert len(store.fire_due_timers(datetime.now(UTC))) == 1


def test_a_timer_whose_message_already_arrived_fires_nothing_and_is_spent(store: Store) -> None:
    info = new_thread(store)
    enqueue(store, info.id, message_id="w-1")
    store.add_timer(info.id, timer("c1", PAST, "w-1"))

    assert store.fire_due_timers(datetime.now(UTC)) == []
    assert store.next_timer_due() is None
    assert len(store.inbox(info.id)) == 1


def test_next_timer_due_is_the_earliest_unfired_timer_as_an_aware_instant(store: Store) -> None:
    info = new_thread(store)
    assert store.next_timer_due() is None
    plus_two = timezone(timedelta(hours=2))
    early = datetime(2030, 5, 1, 14, 0, tzinfo=plus_two)
    store.add_timer(info.id, timer("c1", datetime(2030, 5, 1, 13, 0, tzinfo=UTC)))
    store.add_timer(info.id, timer("c2", early))

    due = store.next_timer_due()

    assert due == early and due is not None and due.tzinfo is not None


def test_racing_sweepers_fire_each_timer_once(open_store: StoreOpener) -> None:
    sweepers = [open_store(), open_store()]
    info = new_thread(sweepers[0])
    message_ids = [f"wake-{n}" for n in range(40)]
    for message_id in message_ids:
        sweepers[0].add_timer(info.id, timer("c1", PAST, message_id))
    barrier = threading.Barrier(len(sweepers))

    def sweep(store: Store) -> list[str]:
        barrier.wait()
        fired: list[str] = []
        while batch := store.fire_due_timers(datetime.now(UTC), limit=3):
            fired += [r.message_id for r in batch]
        return fired

    with ThreadPoolExecutor(len(sweepers)) as pool:
        results = list(pool.map(sweep, sweepers))

    fired = results[0] + results[1]
    assert sorted(fired) == sorted(message_ids)
    assert len(sweepers[0].inbox(info.id)) == len(message_ids)


# Sweeper queries ---------------------------------------------------------------------


def test_has_pending_after_sees_only_newer_pending_rows(store: Store) -> None:
    info = new_thread(store)
    first, second = enqueue(store, info.id), enqueue(store, info.id)

    assert store.has_pending_after(info.id, first.id)
    assert not store.has_pending_after(info.id, second.id)
    store.commit(commit_from(store.load(info.id), done=[second.id]))
    assert not store.has_pending_after(info.id, first.id)


def test_has_pending_after_can_count_only_user_text(store: Store) -> None:
    info = new_thread(store)
    with_calls(store, info.id, record("c1"))
    first = enqueue(store, info.id)
    store.enqueue(info.id, "r-1", ToolResultMessage(call_id="c1", content="ok"), 4)

    assert store.has_pending_after(info.id, first.id)
    assert not store.has_pending_after(info.id, first.id, user_text_only=True)
    enqueue(store, info.id, "steer")
    assert store.has_pending_after(info.id, first.id, user_text_only=True)


def test_threads_to_wake_skips_deferred_rows_until_a_pending_one_arrives(store: Store) -> None:
    quiet, deferred, fresh = new_thread(store), new_thread(store), new_thread(store)
    held = enqueue(store, deferred.id)
    store.commit(commit_from(store.load(deferred.id), inbox_seen=held.id, deferred=[held.id]))
    enqueue(store, fresh.id)

    assert store.threads_to_wake() == [fresh.id]
    assert [r.state for r in store.inbox(deferred.id)] == [InboxState.DEFERRED]
    assert [r.id for r in store.load(deferred.id).inbox] == [held.id]  # still loaded

    enqueue(store, deferred.id)
    assert store.threads_to_wake() == [fresh.id, deferred.id]
    assert store.threads_to_wake(limit=1) == [fresh.id]
    assert quiet.id not in store.threads_to_wake()


def test_a_pending_row_below_inbox_seen_is_still_woken(store: Store) -> None:
    """Rows can become visible out of id order (PostgreSQL): only state decides."""
    info = new_thread(store)
    row = enqueue(store, info.id)
    store.commit(commit_from(store.load(info.id), inbox_seen=row.id + 100))
    assert store.threads_to_wake() == [info.id]


def test_a_deferral_holds_the_user_text_it_saw_to_its_time_but_not_user_text_after(
    store: Store,
) -> None:
    """Issue 35: user text refused for model capacity is told its turn (the thread's
    ``retry_at``): the sweeper used to wake it at every sweep before that, a slice refused
    again. User text sent after a deferral (its own wake lost) still does not wait for
    the thread's place."""
    now = datetime.now(UTC)
    turn = now + timedelta(seconds=30)
    asked = new_thread(store)
    row = enqueue(store, asked.id, "what now?")
    store.defer(asked.id, turn, seen=row.id)
    assert store.thread(asked.id).inbox_seen == row.id
    assert store.threads_to_wake(now=now) == []  # told its turn: not woken before it
    assert store.wakes_due(now=turn) == [(asked.id, Priority.INTERACTIVE)]
    store.defer(asked.id, turn, seen=0)  # a deferral never lowers what was seen
    assert store.thread(asked.id).inbox_seen == row.id
    enqueue(store, asked.id, "and now?")  # sent after the deferral
    assert store.wakes_due(now=now) == [(asked.id, Priority.INTERACTIVE)]

    background = new_thread(store)
    job = enqueue(store, background.id, "job", priority=Priority.BACKGROUND)
    store.defer(background.id, now + timedelta(hours=1), seen=job.id)
    assert background.id not in store.threads_to_wake(now=now)
    enqueue(store, background.id, "a person asks")
    assert (background.id, Priority.INTERACTIVE) in store.wakes_due(now=now)


def test_user_text_of_a_thread_deferred_without_a_mark_is_woken_at_once(store: Store) -> None:
    """A thread deferred by a version that did not record what its slice saw (its
    ``inbox_seen`` below its pending rows) reads as user text sent after the deferral:
    woken at once, as then, rather than held to a place it may not have been told."""
    info = new_thread(store)
    enqueue(store, info.id, "what now?")
    now = datetime.now(UTC)
    store.defer(info.id, now + timedelta(hours=1), seen=0)
    assert store.wakes_due(now=now) == [(info.id, Priority.INTERACTIVE)]
    store.record_failure(info.id, "503", stall_after=5, retry_at=now + timedelta(hours=1))
    assert store.threads_to_wake(now=now) == []  # a failure's backoff holds user text too


def test_threads_to_wake_skips_stalled_threads_and_finished_rows(store: Store) -> None:
    stalled, finished = new_thread(store), new_thread(store)
    enqueue(store, stalled.id)
    store.record_failure(stalled.id, "boom", stall_after=1)
    row = enqueue(store, finished.id)
    store.commit(commit_from(store.load(finished.id), done=[row.id]))

    assert store.threads_to_wake() == []
    store.set_status(stalled.id, ThreadStatus.IDLE)
    assert store.threads_to_wake() == [stalled.id]


# SQL specifics -----------------------------------------------------------------------


def _schema_differences(database_url: str) -> list[Any]:
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def test_the_migrations_build_exactly_the_sqlite_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/schema.db"
    assert _schema_differences(url) != []  # the comparison does see a missing schema

    upgrade(url)
    upgrade(url)  # a second upgrade is a no-op

    assert _schema_differences(url) == []


def test_the_migrations_build_exactly_the_postgres_tables(postgres_url: str) -> None:
    upgrade(postgres_url)

    assert _schema_differences(postgres_url) == []


def test_an_in_memory_sqlite_store_migrates_itself_and_is_shared_between_threads() -> None:
    store = SQLStore("sqlite://")
    try:
        info = new_thread(store)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda n: enqueue(store, info.id, str(n)), range(20)))
        assert len(store.load(info.id).inbox) == 20
    finally:
        store.close()


def test_a_postgres_sweeper_skips_a_timer_another_sweeper_is_firing(postgres_url: str) -> None:
    store = SQLStore(postgres_url)
    other_sweeper = make_engine(postgres_url)
    try:
        info = new_thread(store)
        store.add_timer(info.id, timer("c1", PAST, "held"))
        # The pool is exited last: a blocked sweep must see the lock released first.
        with ThreadPoolExecutor(1) as pool, other_sweeper.begin() as conn:
            conn.execute(text("SELECT id FROM timers WHERE message_id = 'held' FOR UPDATE"))
            sweep = pool.submit(store.fire_due_timers, datetime.now(UTC))
            skipped = sweep.result(timeout=10)  # would wait on the lock without SKIP LOCKED
        fired = store.fire_due_timers(datetime.now(UTC))

        assert "held" not in [r.message_id for r in skipped]
        assert "held" in [r.message_id for r in fired]
    finally:
        other_sweeper.dispose()
        store.close()


def test_postgres_sessions_run_without_jit_and_keep_the_urls_own_options(
    postgres_url: str,
) -> None:
    """JIT compiling a key lookup whose estimate went stale cost 16 ms of a 0.1 ms read."""
    engine = make_engine(f"{postgres_url}?options=-c%20statement_timeout%3D5000")
    try:
        with engine.connect() as conn:
            settings = [
                conn.exec_driver_sql(f"SHOW {name}").scalar()
                for name in ("jit", "statement_timeout")
            ]
    finally:
        engine.dispose()

    assert settings == ["off", "5s"]


def test_sqlite_runs_in_wal_mode_with_foreign_keys_and_a_busy_timeout(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/pragmas.db")
    try:
        with engine.connect() as conn:
            pragmas = [
                conn.exec_driver_sql(f"PRAGMA {name}").scalar()
                for name in ("journal_mode", "foreign_keys", "busy_timeout")
            ]
    finally:
        engine.dispose()

    assert pragmas[0] == "wal" and pragmas[1] == 1 and pragmas[2] > 0


def test_a_row_that_ran_before_its_dispatch_was_stamped_is_never_stranded(store: Store) -> None:
    info = new_thread(store)
    (row,) = store.commit(commit_from(store.load(info.id), outbox=[("c1", "tool")])) or []
    store.mark_ran([row.id])  # a fast tool finished before the slice stamped the dispatch
    store.mark_dispatched([row.id])
    later = datetime.now(UTC) + timedelta(hours=2)
    assert store.undispatched(later, lost_before=later) == []


def test_a_dispatched_row_no_worker_ran_is_found_as_lost_after_the_given_time(
    store: Store,
) -> None:
    info = new_thread(store)
    (row,) = store.commit(commit_from(store.load(info.id), outbox=[("c1", "tool")])) or []
    store.mark_dispatched([row.id])
    now = datetime.now(UTC)
    assert store.undispatched(now + timedelta(hours=1)) == []  # dispatched: not stranded
    assert store.undispatched(now, lost_before=now - timedelta(minutes=5)) == []  # too recent
    lost = store.undispatched(now, lost_before=now + timedelta(minutes=5))
    assert [r.id for r in lost] == [row.id]
    store.mark_ran([row.id])
    assert store.undispatched(now, lost_before=now + timedelta(minutes=5)) == []


def test_a_failing_thread_is_not_woken_before_its_retry_time(store: Store) -> None:
    info = new_thread(store)
    enqueue(store, info.id)
    now = datetime.now(UTC)
    failed = store.record_failure(
        info.id, "503", stall_after=5, retry_at=now + timedelta(seconds=30)
    )
    assert failed.retry_at is not None and failed.retry_at > now
    assert store.threads_to_wake(now=now) == []
    assert store.threads_to_wake(now=now + timedelta(seconds=31)) == [info.id]
    assert store.threads_to_wake() == [info.id]  # without a clock: no backoff applies
    store.set_status(info.id, ThreadStatus.IDLE)
    assert store.thread(info.id).retry_at is None
