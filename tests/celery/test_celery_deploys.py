"""A rolling deploy on real workers: old and new code on the same queues.

The old worker lacks the new tool ``scan`` and the new agent ``ops``. Threads of ``ops``
launched before any new worker is up wait for it, unconsumed; then every tool task and
slice the old worker takes for them is left for the new worker (``runtime/whereabouts.py``):
no call is answered "not installed", no thread stalls, every call gets its one result.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import Deployment, scaled, wait_until

from dormant.messages import AssistantTurn, ToolResult
from dormant.stores.base import ThreadStatus

THREADS = 24
"""Of each agent: enough that the old worker takes some of each kind of work."""


def test_a_rolling_deploy_answers_no_call_for_code_a_worker_lacks(
    deploy: Callable[..., Deployment], monkeypatch: pytest.MonkeyPatch
) -> None:
    d = deploy(DORMANT_AGENTS="deploy_new_agents", DORMANT_ANNOUNCE_INTERVAL_S="1")
    monkeypatch.setenv("TEST_CELERY_LOGLEVEL", "info")  # the old worker's task results
    old = d.start_worker("old", concurrency=4, env={"DORMANT_AGENTS": "deploy_old_agents"})
    d.start_beat()
    d.wait_ready(old)
    client = d.client()
    # The web app is deployed first: it launches the new agent before any new worker is up.
    early = [client.launch("ops", f"deploy early {n}") for n in range(4)]
    wait_until(
        lambda: old.log().count("left for another worker") >= 8,
        scaled(60),
        "the old worker to leave the new agent's slices",
        check=d.check_alive,
    )
    for thread_id in early:
        info = client.thread(thread_id)
        assert info.failures == 0 and info.status is not ThreadStatus.STALLED
        assert client.history(thread_id) == [], "nothing consumed while no worker has 'ops'"

    new = d.start_worker("new", concurrency=4)
    d.wait_ready(new)
    triage = [client.launch("triage", f"scan the api ({n})") for n in range(THREADS)]
    ops = early + [client.launch("ops", f"deploy {n}") for n in range(THREADS)]

    def answered(thread_id: str) -> bool:
        history = client.history(thread_id)
        last = history[-1] if history else None
        return isinstance(last, AssistantTurn) and not last.calls and bool(last.text)

    def settled() -> bool:
        return all(answered(t) for t in triage + ops)

    wait_until(settled, scaled(120), "every thread to settle", check=d.check_alive)

    for thread_id in triage:
        history = client.history(thread_id)
        results = [i for i in history if isinstance(i, ToolResult)]
        calls = [c for i in history if isinstance(i, AssistantTurn) for c in i.calls]
        assert len(results) == len(calls), f"every call one result in {thread_id}"
        for result in results:
            assert result.content == "api: 0 findings", (thread_id, result.content)
    for thread_id in ops:
        info = client.thread(thread_id)
        assert info.status is ThreadStatus.IDLE
        assert info.failures == 0 and not info.last_error, (thread_id, info.last_error)
        assert client.history(thread_id)[-1].text == "new code: ops"  # type: ignore[union-attr]
    old_log = old.log()
    assert "not installed" not in d.logs()
    assert "left for another worker" in old_log, "the old worker met new work and left it"
