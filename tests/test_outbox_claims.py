"""Tool runs hold a claim in SQL, renewed while they run: a dead run is re-sent in seconds,
not after the broker's visibility timeout, and a finished tool hands its result in even
while the database blinks."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy.exc

from dormant.runtime.sweeper import sweep_once
from dormant.stores.base import OutboxRow, Store
from dormant.stores.memory.sync import MemoryLease
from dormant.tools.claims import held_claim
from dormant.tools.runner import hand_in
from tests.test_store_contract import commit_from, new_thread

HOUR = timedelta(hours=1)


class _Recorder:
    def __init__(self) -> None:
        self.dispatched: list[int] = []
        self.woken: list[str] = []

    def wake(self, thread_id: str, priority: int) -> bool:
        self.woken.append(thread_id)
        return True

    def dispatch(self, row: OutboxRow) -> None:
        self.dispatched.append(row.id)


def _row(store: Store) -> OutboxRow:
    info = new_thread(store)
    (row,) = store.commit(commit_from(store.load(info.id), outbox=[("c1", "tool")])) or []
    store.mark_dispatched([row.id])
    return row


def test_a_claimed_row_cannot_be_claimed_again_until_its_claim_lapses(store: Store) -> None:
    row = _row(store)
    now = datetime.now(UTC)
    assert store.claim_outbox(row.id, now + HOUR) == 1, "the first run"
    assert store.claim_outbox(row.id, now + HOUR) == 0, "a live run holds it"
    assert store.renew_outbox_claim(row.id, now - timedelta(seconds=1))  # the run stops beating
    assert store.claim_outbox(row.id, now + HOUR) == 2, "a lapsed claim is free: run 2"
    store.mark_ran([row.id])
    assert not store.claim_outbox(row.id, now + 2 * HOUR), "a row that ran is never run again"
    assert not store.renew_outbox_claim(row.id, now + HOUR)


def test_a_lapsed_claim_is_taken_back_by_exactly_one_sweeper(store: Store) -> None:
    row = _row(store)
    now = datetime.now(UTC)
    assert store.claim_outbox(row.id, now + timedelta(seconds=30))
    assert store.expired_claims(now) == []
    later = now + timedelta(seconds=31)
    assert [r.id for r in store.expired_claims(later)] == [row.id]
    assert store.reclaim_outbox(row.id, later)
    assert not store.reclaim_outbox(row.id, later), "the second sweeper finds it taken"
    assert store.expired_claims(later + HOUR) == [], "unclaimed again, dispatched anew"
    assert store.claim_outbox(row.id, later + HOUR), "the re-sent task can claim it"


def test_a_live_claim_is_not_reported_lost_and_a_lapsed_one_is(store: Store) -> None:
    row = _row(store)
    now = datetime.now(UTC)
    store.claim_outbox(row.id, now + HOUR)
    soon = now + timedelta(minutes=5)
    assert store.undispatched(now, lost_before=soon) == [], "a long tool run is alive"
    store.renew_outbox_claim(row.id, now)
    assert [r.id for r in store.undispatched(now, lost_before=soon)] == [row.id]


def test_the_sweeper_resends_a_dead_run_well_before_the_visibility_timeout(
    store: Store,
) -> None:
    row = _row(store)
    now = datetime.now(UTC)
    store.claim_outbox(row.id, now + timedelta(seconds=3))  # then its worker is SIGKILLed
    dispatcher = _Recorder()
    visibility_s = 3600.0
    sweep_once(store, MemoryLease(), dispatcher, now, 10.0, visibility_s)
    assert dispatcher.dispatched == [], "the claim is still live"
    sweep_once(store, MemoryLease(), dispatcher, now + timedelta(seconds=4), 10.0, visibility_s)
    assert dispatcher.dispatched == [row.id]
    sweep_once(store, MemoryLease(), dispatcher, now + timedelta(seconds=5), 10.0, visibility_s)
    assert dispatcher.dispatched == [row.id], "sent once, then it waits for the new run"


def test_the_heartbeat_keeps_a_long_run_claimed(store: Store) -> None:
    row = _row(store)
    # A lifetime long enough that a busy machine's scheduling delays cannot outlast the
    # heartbeat's two renewals within it (0.3 s failed at load average 20).
    with held_claim(store, row.id, ttl_s=1.5) as claimed:
        assert claimed
        deadline = time.monotonic() + 4.5
        while time.monotonic() < deadline:  # three claim lifetimes
            assert store.expired_claims(datetime.now(UTC)) == []
            time.sleep(0.1)
    with held_claim(store, row.id, ttl_s=30) as again:
        assert not again, "the first run's claim is still live"


def test_one_thread_keeps_many_runs_claimed_and_stops_renewing_a_finished_one(
    store: Store,
) -> None:
    rows = [_row(store) for _ in range(12)]
    before = threading.active_count()
    with contextlib.ExitStack() as runs:
        assert all(runs.enter_context(held_claim(store, r.id, ttl_s=1.5)) for r in rows)
        assert threading.active_count() <= before + 1, "one renewing thread, not one a run"
        deadline = time.monotonic() + 4.5
        while time.monotonic() < deadline:  # three claim lifetimes
            assert store.expired_claims(datetime.now(UTC)) == []
            time.sleep(0.1)
    # Released: nothing renews the claims any more, so they lapse within one lifetime.
    deadline = time.monotonic() + 30
    while len(store.expired_claims(datetime.now(UTC))) < len(rows):
        assert time.monotonic() < deadline, "a released claim is still renewed"
        time.sleep(0.1)


class _Flaky:
    """Fails ``failures`` times the way a restarting PostgreSQL does, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise sqlalchemy.exc.OperationalError("INSERT", {}, ConnectionRefusedError())


def test_a_result_hand_in_is_retried_while_the_database_is_down() -> None:
    attempt = _Flaky(failures=3)
    hand_in("result", attempt, timeout_s=30)
    assert attempt.calls == 4


def test_a_hand_in_gives_up_after_its_timeout_and_never_retries_a_bug() -> None:
    attempt = _Flaky(failures=100)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        hand_in("result", attempt, timeout_s=0.5)
    assert 1 < attempt.calls < 10

    def buggy() -> None:
        raise KeyError("choices")

    with pytest.raises(KeyError):
        hand_in("result", buggy, timeout_s=30)
