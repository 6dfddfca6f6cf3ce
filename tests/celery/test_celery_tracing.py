"""A traced turn on real Celery workers: one trace across slices, tool tasks, processes and
a worker restart, each span exported once (``dormant.tracing``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery_agents import shared_key

from dormant.client import Client
from tests.celery.conftest import Deployment, wait_until

SLICES = "dormant.interactive,dormant.background"
TOOLS = "dormant.tools"


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _named(spans: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"].startswith(prefix)]


def _idle(client: Client, thread_id: str) -> bool:
    return client.thread(thread_id).status == "idle"


@pytest.mark.parametrize("instrumented", [False, True], ids=["alone", "instrumentation-celery"])
def test_a_turn_across_two_workers_and_a_restart_is_one_trace_each_span_once(
    deploy: Callable[..., Deployment], tmp_path: Path, instrumented: bool
) -> None:
    """Alone, and beside ``opentelemetry-instrumentation-celery``: its task spans join
    the same trace, and none of dormant's spans loses its parent or appears twice."""
    trace_file = tmp_path / "spans.jsonl"
    d = deploy(
        DORMANT_AGENTS="tracing_agents",
        TEST_TRACE_FILE=str(trace_file),
        TEST_INSTRUMENT_CELERY="1" if instrumented else "0",
    )
    slices = d.start_worker("slices", queues=SLICES)
    tools = d.start_worker("tools", queues=TOOLS)
    d.wait_ready(slices, tools)
    client = d.client()
    thread_id = client.launch("traced", "what is k?")

    # The first slice ran on "slices" and its tool waits at the gate on "tools": restart
    # the slice worker now, so the next slices run in another process.
    wait_until(
        lambda: _named(_spans(trace_file), "invoke_agent"),
        30,
        "the first slice's span",
        check=d.check_alive,
    )
    d.expected_deaths.add("slices")
    slices.kill()
    again = d.start_worker("slices-again", queues=SLICES)
    d.wait_ready(again)
    d.redis.rpush(shared_key(d.prefix, "gate"), "open")
    wait_until(lambda: _idle(client, thread_id), 45, "the turn to end", check=d.check_alive)
    wait_until(lambda: len(_named(_spans(trace_file), "invoke_agent")) >= 3, 10, "the last span")

    spans = _spans(trace_file)
    ours = [s for s in spans if not s["name"].startswith(("run/", "apply_async/"))]
    names = sorted(s["name"] for s in ours)
    assert names == sorted(
        ["invoke_agent traced"] * 3 + ["chat scripted"] * 3 + ["execute_tool gated_lookup"] * 2
    ), names  # each exactly once: nothing re-emitted by a restart or a redelivery
    assert len({s["trace_id"] for s in spans}) == 1, "one trace for the whole turn"
    ids = {s["span_id"] for s in spans}
    roots = [s for s in spans if s["parent_id"] is None]
    first = "run/dormant.slice" if instrumented else "invoke_agent traced"
    assert [r["name"] for r in roots] == [first]
    assert all(s["parent_id"] in ids for s in spans if s is not roots[0]), "every span parented"
    assert {s["attributes"]["gen_ai.conversation.id"] for s in ours} == {thread_id}
    by_id = {s["span_id"]: s for s in spans}
    slices = _named(spans, "invoke_agent")
    starts = [s for s in slices if s["parent_id"] is None or s["parent_id"] == roots[0]["span_id"]]
    later = [s for s in slices if s not in starts]
    assert len(starts) == 1, "the first slice: the root, or the Celery task span's child"
    assert len(later) == 2
    assert all(by_id[s["parent_id"]]["name"] == "execute_tool gated_lookup" for s in later)
    tool_spans = _named(spans, "execute_tool")
    assert all(by_id[t["parent_id"]]["name"] == "invoke_agent traced" for t in tool_spans)
    slice_pids = {s["pid"] for s in slices}
    tool_pids = {t["pid"] for t in tool_spans}
    assert len(slice_pids) == 2 and not slice_pids & tool_pids, "three processes took part"
    if instrumented:
        assert {"run/dormant.tool", "apply_async/dormant.tool"} <= {s["name"] for s in spans}


def test_a_slice_redelivered_from_a_dead_worker_is_marked_with_one_chat_on_its_committed_path(
    deploy: Callable[..., Deployment], tmp_path: Path
) -> None:
    trace_file = tmp_path / "spans.jsonl"
    d = deploy(
        DORMANT_AGENTS="tracing_agents",
        TEST_TRACE_FILE=str(trace_file),
        DORMANT_LEASE_TTL_S="2",
        DORMANT_VISIBILITY_TIMEOUT_S="4",  # Redis hands the dead worker's task on after it
    )
    doomed = d.start_worker("doomed", env={"DORMANT_CRASH_POINTS": "after_model"})
    d.expected_deaths.add("doomed")
    client = d.client()
    thread_id = client.launch("replier", "hi")
    wait_until(lambda: not doomed.alive(), 30, "the worker to die after its model call")
    survivor = d.start_worker("survivor")  # no beat: only the broker's redelivery runs it
    d.wait_ready(survivor)
    wait_until(lambda: _idle(client, thread_id), 45, "the redelivered slice", check=d.check_alive)
    wait_until(lambda: _named(_spans(trace_file), "invoke_agent"), 10, "its span")

    spans = _spans(trace_file)
    (committed,) = _named(spans, "invoke_agent")  # the dead slice's never ended
    assert committed["attributes"]["dormant.slice.redelivered"] is True
    assert committed["attributes"]["dormant.slice.outcome"] == "Idle"
    chats = _named(spans, "chat")
    under = [c for c in chats if c["parent_id"] == committed["span_id"]]
    assert len(under) == 1, "one chat on the committed path"
    assert len(chats) == 2, "the dead slice's model call is there too, under its lost slice"


def _first_slice_done(spans: list[dict[str, Any]], instrumented: bool) -> bool:
    """The first slice's span is exported, and the Celery task span around it if any
    (the slice worker is killed next: what it has not exported is lost)."""
    slices = _named(spans, "invoke_agent")
    if not slices:
        return False
    if not instrumented:
        return True
    return any(s["span_id"] == slices[0]["parent_id"] for s in spans)
