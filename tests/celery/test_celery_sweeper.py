"""``sweep_once``: what the beat task (and LocalSystem's loop) re-drives from the store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dormant.messages import ToolResultMessage, UserMessage
from dormant.runtime.sweeper import sweep_once
from dormant.stores.base import (
    CallRecord,
    CallState,
    Commit,
    NewThread,
    NewTimer,
    OutboxRow,
    Priority,
    ThreadStatus,
)
from dormant.stores.memory.store import MemoryStore
from dormant.stores.memory.sync import MemoryLease


class _Dispatcher:
    def __init__(self) -> None:
        self.woken: list[tuple[str, int]] = []
        self.dispatched: list[OutboxRow] = []

    def wake(self, thread_id: str, priority: int) -> None:
        self.woken.append((thread_id, priority))

    def dispatch(self, row: OutboxRow) -> None:
        self.dispatched.append(row)


def test_a_sweep_wakes_unapplied_threads_without_a_live_lease() -> None:
    store, lease, dispatcher = MemoryStore(), MemoryLease(), _Dispatcher()
    for thread_id in ("free", "leased"):
        store.create_thread(NewThread(id=thread_id, agent="a"))
        store.enqueue(thread_id, "m1", UserMessage(text="hi"), Priority.INTERACTIVE)
    lease.acquire("leased", 60)

    assert sweep_once(store, lease, dispatcher, datetime.now(UTC), grace_s=10, lost_after_s=3600)
    assert dispatcher.woken == [("free", Priority.INTERACTIVE)]  # the priority of its row


def test_a_sweep_fires_due_timers_and_redispatches_stranded_outbox_rows() -> None:
    store, lease, dispatcher = MemoryStore(), MemoryLease(), _Dispatcher()
    store.create_thread(NewThread(id="t1", agent="a"))
    row = store.enqueue("t1", "m1", UserMessage(text="hi"), Priority.INTERACTIVE)
    commit = Commit(
        thread_id="t1",
        version=store.thread("t1").version,
        status=ThreadStatus.WAITING,
        inbox_seen=row.id,
        calls=[
            CallRecord("call_1", "add", {}, 2, CallState.PENDING),
            CallRecord("call_2", "sleep", {}, 2, CallState.PENDING, passive=True),
        ],
        done=[row.id],
        outbox=[("call_1", "tool")],
    )
    assert store.commit(commit) is not None  # ... and the worker died before dispatching
    now = datetime.now(UTC)
    message = ToolResultMessage(call_id="call_2", content="slept")
    store.add_timer("t1", NewTimer("call_2", now - timedelta(seconds=1), "timer:call_2", message))

    assert not sweep_once(
        store, lease, _Dispatcher(), now - timedelta(seconds=5), grace_s=10, lost_after_s=3600
    )
    assert sweep_once(
        store, lease, dispatcher, now + timedelta(seconds=11), grace_s=10, lost_after_s=3600
    )
    assert dispatcher.woken[0] == ("t1", Priority.BACKGROUND)
    assert [(r.call_id, r.action) for r in dispatcher.dispatched] == [("call_1", "tool")]
    assert store.undispatched(now + timedelta(days=1)) == []
    again = _Dispatcher()  # the timer's message stays unapplied until a slice runs
    assert sweep_once(
        store, lease, again, now + timedelta(seconds=12), grace_s=10, lost_after_s=3600
    )
    assert again.woken == [("t1", Priority.BACKGROUND)] and again.dispatched == []
