"""``sweep_once``: what beat's sweep (and LocalSystem's loop) re-drives from the store."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import redis
from celery import Celery

from dormant.celery.dispatch import CeleryDispatcher
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
from dormant.stores.redis import RedisWakeMarks


class _Dispatcher:
    def __init__(self) -> None:
        self.woken: list[tuple[str, int]] = []
        self.dispatched: list[OutboxRow] = []

    def wake(self, thread_id: str, priority: int) -> bool:
        self.woken.append((thread_id, priority))
        return True

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


def test_a_sweep_whose_wake_a_wake_mark_suppressed_does_not_report_it_woken(
    redis_server: redis.Redis,
) -> None:
    """The Celery dispatcher sends no slice while one at least as urgent is queued (its
    wake mark in Redis): the sweep that found the thread then says so, not "woke"."""
    store, lease = MemoryStore(), MemoryLease()
    store.create_thread(NewThread(id="t1", agent="a"))
    store.enqueue("t1", "m1", UserMessage(text="hi"), Priority.INTERACTIVE)
    prefix = f"dsw{secrets.token_hex(5)}"
    app = Celery("sweeper-test", broker="memory://", set_as_current=False)
    dispatcher = CeleryDispatcher(app, RedisWakeMarks(redis_server, prefix, ttl_s=60.0))
    try:
        first = sweep_once(store, lease, dispatcher, datetime.now(UTC), 10, 3600)
        second = sweep_once(store, lease, dispatcher, datetime.now(UTC), 10, 3600)
    finally:
        redis_server.delete(f"{prefix}:queued:t1")
        app.close()

    assert first
    assert not second, second  # the first sweep's slice is still queued: nothing was sent
    assert first.woken == 1 and first.summary() == "woke 1 thread"
    assert (second.woken, second.already_queued) == (0, 1)
    assert second.summary() == "1 wake already queued"
