"""The chaos run's verdict counts each violation once, under what it means for the work.

A message not applied when the run ends is never lost: stuck if the run ended at the
quiesce deadline, in flight if it arrived after the system was seen quiet. The store is
the memory store, written through its own ``commit`` as a slice would.
"""

from __future__ import annotations

from datetime import UTC, datetime

from chaos.verdict import RECOVERY_BOUND_S, assess
from dormant.messages import AssistantTurn, Item, ToolCall, ToolResult, UserMessage, UserText
from dormant.settings import Settings
from dormant.stores.base import (
    CallRecord,
    CallState,
    Commit,
    NewThread,
    StoredItem,
    ThreadStatus,
)
from dormant.stores.memory.store import MemoryStore

THREAD = "thr_chaos00001"


def store_with_u0_applied() -> MemoryStore:
    """A thread whose first user message ``u0`` is in its history."""
    store = MemoryStore()
    store.create_thread(NewThread(id=THREAD, agent="chaos"))
    store.enqueue(THREAD, "u0", UserMessage(text="u0"), 8)
    apply(store, ("u0", UserText(text="u0")))
    return store


def apply(store: MemoryStore, *items: tuple[str, Item]) -> None:
    """Commit ``items`` (message id, item) and mark every pending row done, as a slice would
    (each call made gets its record, answered)."""
    snap = store.load(THREAD)
    stored = [StoredItem(snap.next_seq + i, m, it) for i, (m, it) in enumerate(items)]
    calls = [
        CallRecord(c.call_id, c.name, c.args, s.seq, CallState.ANSWERED)
        for s in stored
        if isinstance(s.item, AssistantTurn)
        for c in s.item.calls
    ]
    commit = Commit(
        THREAD,
        snap.thread.version,
        ThreadStatus.IDLE,
        max((r.id for r in snap.inbox), default=0),
        items=stored,
        calls=calls,
        done=[r.id for r in snap.inbox],
    )
    assert store.commit(commit) is not None


def test_a_message_not_applied_when_the_quiesce_deadline_passes_is_stuck_not_lost() -> None:
    store = store_with_u0_applied()
    store.enqueue(THREAD, "u1", UserMessage(text="u1"), 8)
    verdict = assess(store, {THREAD: ["u0", "u1"]}, ended_at=datetime.now(UTC), quiesced=False)
    assert verdict.lost == []
    [stuck] = verdict.stuck
    assert THREAD in stuck and "(u1) was never applied" in stuck


def test_a_message_that_arrived_after_the_system_was_seen_quiet_is_still_in_flight() -> None:
    store = store_with_u0_applied()
    seen_quiet_at = datetime.now(UTC)
    store.enqueue(THREAD, "u1", UserMessage(text="u1"), 8)
    verdict = assess(store, {THREAD: ["u0", "u1"]}, ended_at=seen_quiet_at, quiesced=True)
    assert (verdict.lost, verdict.stuck, verdict.broken) == ([], [], [])
    assert verdict.ok


def test_a_message_consumed_without_reaching_the_history_is_lost_once() -> None:
    store = store_with_u0_applied()
    store.enqueue(THREAD, "u1", UserMessage(text="u1"), 8)
    apply(store)  # u1's row is done, and nothing of it was stored
    verdict = assess(store, {THREAD: ["u0", "u1"]}, ended_at=datetime.now(UTC), quiesced=True)
    [lost] = verdict.lost
    assert "consumed but not in the history: u1" in lost
    assert verdict.stuck == []


def test_a_message_sent_but_never_stored_is_lost() -> None:
    store = store_with_u0_applied()
    verdict = assess(store, {THREAD: ["u0", "u1"]}, ended_at=datetime.now(UTC), quiesced=True)
    assert verdict.lost == [f"{THREAD}: user message u1 sent, never stored"]


def test_a_message_set_aside_by_quarantine_is_stuck_not_lost() -> None:
    store = store_with_u0_applied()
    row = store.enqueue(THREAD, "u1", UserMessage(text="u1"), 8)
    store.quarantine(THREAD, row.id, "the model failed 3 times")
    verdict = assess(store, {THREAD: ["u0", "u1"]}, ended_at=datetime.now(UTC), quiesced=True)
    assert verdict.lost == []
    assert verdict.stuck == [f"{THREAD}: user message u1 set aside: the model failed 3 times"]


def test_a_call_answered_three_times_is_duplicated() -> None:
    store = store_with_u0_applied()
    turn = AssistantTurn(calls=(ToolCall(call_id="c1", name="add"),))
    result = ToolResult(call_id="c1", name="add", content="2")
    apply(store, ("t1", turn), ("r1", result), ("r2", result), ("r3", result))
    verdict = assess(store, {THREAD: ["u0"]}, ended_at=datetime.now(UTC), quiesced=True)
    [duplicated] = verdict.duplicated
    assert "add c1 has 3 results" in duplicated
    assert (verdict.lost, verdict.stuck, verdict.broken) == ([], [], [])


def test_a_result_for_a_call_never_made_is_broken_not_stuck() -> None:
    store = store_with_u0_applied()
    apply(store, ("r1", ToolResult(call_id="ghost", name="add", content="2")))
    verdict = assess(store, {THREAD: ["u0"]}, ended_at=datetime.now(UTC), quiesced=True)
    [broken] = verdict.broken
    assert "results for calls never made: ghost" in broken
    assert verdict.stuck == [] and not verdict.ok


def test_a_run_quiet_later_than_the_recovery_bound_after_its_last_fault_fails() -> None:
    store = store_with_u0_applied()
    verdict = assess(store, {THREAD: ["u0"]}, ended_at=datetime.now(UTC), quiesced=True)
    verdict.recovery_s = 12.4
    assert verdict.ok
    assert "recovery time            12.4 s after the last fault (bound 30 s)" in verdict.report(7)
    verdict.recovery_s = 104.0  # the tool start timeout's five minutes, before issue 31
    report = verdict.report(7)
    assert not verdict.ok and report.endswith("FAIL")
    assert "SLOW RECOVERY: quiet 104.0 s after the last fault ended, over the 30 s bound" in report


def test_a_dead_tool_run_comes_back_within_the_recovery_bound_with_the_defaults() -> None:
    """The slowest re-send with the shipped defaults: a worker killed inside a tool right
    after renewing its claim leaves it for the whole TTL, then a sweep sends the row again,
    and the run and its result's slice take a few seconds on a busy machine. The default
    TTL was once 30 s: such a run quiesced 31.2 s after its last fault."""
    defaults = Settings()
    slowest_s = defaults.tool_claim_ttl_s + defaults.sweep_interval_s
    assert slowest_s + 5.0 <= RECOVERY_BOUND_S
