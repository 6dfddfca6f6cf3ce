"""Flower's names for tasks: known agents and tools name them; the cache stays bounded."""

from __future__ import annotations

from datetime import UTC, datetime

from dormant.celery.labels import TaskLabels
from dormant.stores.base import CallRecord, CallState, OutboxRow


def record(call_id: str, name: str) -> CallRecord:
    return CallRecord(call_id, name, {}, 1, CallState.PENDING)


def row(thread_id: str, call_id: str, action: str = "tool") -> OutboxRow:
    return OutboxRow(1, thread_id, call_id, action, datetime.now(UTC))


def test_known_agents_and_tools_name_their_tasks_and_unknown_ones_do_not() -> None:
    labels = TaskLabels()
    labels.note_agent("thr_1", "triage")
    labels.note_calls("thr_1", [record("c1", "run_build")])
    assert labels.slice_name("dormant.slice", "thr_1") == "dormant.slice[triage]"
    assert labels.slice_name("dormant.slice", "thr_2") is None
    assert labels.tool_name("dormant.tool", row("thr_1", "c1")) == "dormant.tool[run_build]"
    assert labels.tool_name("dormant.tool", row("thr_1", "c9")) is None


def test_the_least_recently_used_entries_are_dropped_beyond_the_bound() -> None:
    labels = TaskLabels(max_entries=2)
    labels.note_agent("thr_1", "a")
    labels.note_agent("thr_2", "b")
    assert labels.agent("thr_1") == "a"  # now the most recently used
    labels.note_agent("thr_3", "c")
    assert (labels.agent("thr_1"), labels.agent("thr_2"), labels.agent("thr_3")) == ("a", None, "c")
    labels.note_calls("thr_1", [record(f"c{i}", f"tool{i}") for i in range(5)])
    assert [labels.tool("thr_1", f"c{i}") for i in range(5)] == [None, None, None, "tool3", "tool4"]
