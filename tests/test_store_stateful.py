"""A stateful test of the store contract: SQLite and PostgreSQL behave as the memory store.

Hypothesis drives random sequences of every store operation (threads, enqueues with
duplicate ids, commits that consume, reject and defer rows, stale commits, failures,
statuses, timers, dispatches) against the memory store and an SQL store side by side, and
after every step compares what each would show a slice, a client and the sweeper. Ids and
timestamps a backend assigns are left out of the comparison; everything else must match.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from dormant.errors import DormantError
from dormant.messages import AssistantTurn, ToolCall, ToolResultMessage, UserMessage, UserText
from dormant.stores.base import (
    CallRecord,
    CallState,
    Commit,
    NewThread,
    NewTimer,
    Store,
    StoredItem,
    ThreadStatus,
)
from dormant.stores.memory.store import MemoryStore
from dormant.stores.sql.store import SQLStore, upgrade
from tests.conftest import _truncate_postgres

THREADS = ["t1", "t2", "t3"]
MESSAGE_IDS = [f"m{i}" for i in range(6)]
CALL_IDS = ["c1", "c2"]
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def outcome(action: Callable[[], Any]) -> Any:
    """What an operation returned, or the kind of error it raised (the contract's words)."""
    try:
        return ("ok", action())
    except DormantError as error:
        return ("error", type(error).__name__)


class StoreContract(RuleBasedStateMachine):
    def __init__(self, open_sql: Callable[[], Store]) -> None:
        super().__init__()
        self.model: Store = MemoryStore()
        self.sql = open_sql()
        self.stores = (self.model, self.sql)

    def teardown(self) -> None:
        self.sql.close()

    def both(self, operation: Callable[[Store], Any]) -> Any:
        expected, actual = (outcome(lambda s=s: operation(s)) for s in self.stores)  # type: ignore[misc]
        assert _plain(actual) == _plain(expected)
        event(
            f"{getattr(operation, '__name__', '?')}: {expected if expected[0] == 'error' else 'ok'}"
        )
        return expected

    @initialize()
    def create_two_threads(self) -> None:
        for thread_id in THREADS[:2]:
            self.both(lambda s, t=thread_id: s.create_thread(NewThread(id=t, agent="a")))  # type: ignore[misc]

    @rule(thread_id=st.sampled_from(THREADS))
    def create_thread(self, thread_id: str) -> None:
        self.both(lambda s: s.create_thread(NewThread(id=thread_id, agent="a")))

    @rule(
        thread_id=st.sampled_from(THREADS),
        message_id=st.sampled_from(MESSAGE_IDS),
        result_for=st.sampled_from([None, *CALL_IDS]),
        priority=st.sampled_from([4, 8]),
    )
    def enqueue(
        self, thread_id: str, message_id: str, result_for: str | None, priority: int
    ) -> None:
        message = (
            UserMessage(text=f"text {message_id}")
            if result_for is None
            else ToolResultMessage(call_id=result_for, content="green")
        )
        self.both(lambda s: s.enqueue(thread_id, message_id, message, priority))

    @rule(
        thread_id=st.sampled_from(THREADS),
        consume=st.lists(st.sampled_from(["done", "rejected", "deferred", "keep"]), max_size=6),
        call_states=st.lists(st.sampled_from(list(CallState)), max_size=2),
        status=st.sampled_from([ThreadStatus.IDLE, ThreadStatus.WAITING, ThreadStatus.CLOSED]),
        stale=st.booleans(),
        with_timer=st.booleans(),
    )
    def commit(
        self,
        thread_id: str,
        consume: list[str],
        call_states: list[CallState],
        status: ThreadStatus,
        stale: bool,
        with_timer: bool,
    ) -> None:
        def commit(store: Store) -> Any:
            snap = store.load(thread_id)
            rows = {"done": [], "rejected": [], "deferred": []}  # type: dict[str, list[int]]
            for row, fate in zip(snap.inbox, consume, strict=False):
                if fate != "keep":
                    rows[fate].append(row.id)
            calls = [
                CallRecord(cid, "build", {"n": 1}, snap.next_seq + 1, state)
                for cid, state in zip(CALL_IDS, call_states, strict=False)
            ]
            items = [
                StoredItem(snap.next_seq, f"u{snap.next_seq}", UserText(text="hi")),
                StoredItem(
                    snap.next_seq + 1,
                    f"a{snap.next_seq}",
                    AssistantTurn(
                        calls=tuple(ToolCall(call_id=c.call_id, name="build") for c in calls)
                    ),
                ),
            ]
            timers = (
                [
                    NewTimer(
                        "c1",
                        FAR_FUTURE - timedelta(days=1),
                        "timer:c1",
                        ToolResultMessage(call_id="c1", content="woke"),
                    )
                ]
                if with_timer and calls
                else []
            )
            return store.commit(
                Commit(
                    thread_id=thread_id,
                    version=snap.thread.version - 1 if stale else snap.thread.version,
                    status=status,
                    inbox_seen=max((r.id for r in snap.inbox), default=0),
                    items=items,
                    calls=calls,
                    done=rows["done"],
                    rejected=[(i, "refused") for i in rows["rejected"]],
                    deferred=rows["deferred"],
                    outbox=[(c.call_id, "tool") for c in calls if c.state is CallState.PENDING],
                    timers=timers,
                )
            )

        self.both(commit)

    @rule(thread_id=st.sampled_from(THREADS), stall_after=st.integers(min_value=1, max_value=3))
    def record_failure(self, thread_id: str, stall_after: int) -> None:
        self.both(lambda s: s.record_failure(thread_id, "boom", stall_after, FAR_FUTURE))

    @rule(thread_id=st.sampled_from(THREADS), status=st.sampled_from(list(ThreadStatus)))
    def set_status(self, thread_id: str, status: ThreadStatus) -> None:
        self.both(lambda s: s.set_status(thread_id, status))

    @rule()
    def fire_timers(self) -> None:
        self.both(lambda s: s.fire_due_timers(FAR_FUTURE))

    @rule(ran=st.booleans())
    def dispatch_everything(self, ran: bool) -> None:
        def dispatch(store: Store) -> Any:
            rows = store.undispatched(FAR_FUTURE, limit=1000, lost_before=FAR_FUTURE)
            ids = [r.id for r in rows]
            store.mark_ran(ids) if ran else store.mark_dispatched(ids)
            return rows

        self.both(dispatch)

    @invariant()
    def every_reader_sees_the_same(self) -> None:
        for t in THREADS:
            self.both(lambda s, t=t: s.load(t))  # type: ignore[misc]
            self.both(lambda s, t=t: _rows_seen(s, t))  # type: ignore[misc]
            self.both(lambda s, t=t: s.own_items(t))  # type: ignore[misc]
            self.both(lambda s, t=t: s.inbox(t))  # type: ignore[misc]
            self.both(lambda s, t=t: s.children(t))  # type: ignore[misc]
        self.both(lambda s: sorted(s.threads_to_wake(limit=100, now=FAR_FUTURE)))
        self.both(lambda s: sorted(t.id for t in s.threads(limit=100)))
        self.both(lambda s: s.next_timer_due() is not None)


# ``inbox_seen`` is a row id, assigned by the backend: compared through ``_rows_seen`` instead.
_ASSIGNED = {
    "id",
    "created_at",
    "updated_at",
    "dispatched_at",
    "ran_at",
    "fired_at",
    "retry_at",
    "inbox_seen",
}


def _rows_seen(store: Store, thread_id: str) -> list[str]:
    """The message ids of the inbox rows a thread's ``inbox_seen`` mark covers."""
    snap = store.load(thread_id)
    return [row.message_id for row in snap.inbox if row.id <= snap.thread.inbox_seen]


def _plain(value: Any) -> Any:
    """``value`` without what a backend assigns (ids, timestamps), lists order-preserved."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in _ASSIGNED}
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:
        return {k: _plain(getattr(value, k)) for k in fields if k not in _ASSIGNED}
    return value


def _sqlite(tmp_path: Path) -> Callable[[], Store]:
    """Each example gets a copy of one migrated file: migrating 40 times is most of the time."""
    template = tmp_path / "migrated.db"
    upgrade(f"sqlite:///{template}")
    counter = iter(range(10**6))

    def open_sql() -> Store:
        path = tmp_path / f"stateful-{next(counter)}.db"
        shutil.copyfile(template, path)
        return SQLStore(f"sqlite:///{path}")

    return open_sql


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("backend", "examples"), [("sqlite", 25), ("postgres", 10)])
def test_sql_stores_keep_the_contract_the_memory_store_keeps(
    backend: str, examples: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        open_sql = _sqlite(tmp_path)
    else:
        url = request.getfixturevalue("postgres_url")

        def open_sql() -> Store:
            _truncate_postgres(url)
            return SQLStore(url)

    run_state_machine_as_test(
        lambda: StoreContract(open_sql),
        settings=settings(
            # A longer hunt: DORMANT_STATEFUL_EXAMPLES=300 pytest tests/test_store_stateful.py
            max_examples=int(os.environ.get("DORMANT_STATEFUL_EXAMPLES", examples)),
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
