"""``dormant demo``'s story on real Celery workers: a deferred build, a subscription, and a
pull-request event handled by a temporary child thread that reports to its parent.

The worker and beat are started through ``dormant worker`` and ``dormant beat``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import Deployment, wait_until

from dormant.client import Client
from dormant.errors import DuplicateMessage, InvalidToken, UnknownCall
from dormant.messages import AssistantTurn, EventShown, ItemAdded, ToolDispatched, ToolResult
from dormant.stores.base import ThreadStatus


def _calls(client: Client, thread_id: str) -> dict[str, str]:
    history = client.history(thread_id)
    return {c.name: c.call_id for i in history if isinstance(i, AssistantTurn) for c in i.calls}


def test_the_demo_runs_on_celery_workers(deploy: Callable[..., Deployment]) -> None:
    d = deploy(DORMANT_AGENTS="")  # the worker gets its agents from the command line
    worker = d.start_cli("w1", "worker", "--agents", "celery_agents", "-c", "4", "-l", "warning")
    d.start_cli("beat", "beat", "-l", "warning")
    d.wait_ready(worker)
    client = d.client()

    def wait(predicate: Callable[[], object], what: str) -> object:
        return wait_until(predicate, 20, what, check=d.check_alive)

    thread_id = client.launch("triage", "Build main, and tell me when a PR comes in.")
    url = wait(lambda: d.redis.lindex(d.key("callbacks"), 0), "the build's callback URL")
    assert isinstance(url, str)
    wait(
        lambda: any(isinstance(i, ToolResult) for i in client.history(thread_id)),
        "the subscription's first result",
    )
    assert client.thread(thread_id).status is ThreadStatus.WAITING  # the build is running

    with pytest.raises(InvalidToken):
        client.deliver_callback(url[:-4] + "AAAA", "green")
    with pytest.raises(UnknownCall):
        client.deliver(thread_id, "call_made_up", "green")
    client.deliver_callback(url, "green, 1,204 tests passed", message_id="ci-build-main-1")
    wait(lambda: "wait_for_event" in _calls(client, thread_id), "the build report")
    with pytest.raises(DuplicateMessage):
        client.deliver_callback(url, "green", message_id="ci-build-main-1")

    watch_id = _calls(client, thread_id)["watch_pull_requests"]
    client.send_event(thread_id, watch_id, "PR #42 opened by dana", message_id="gh-delivery-42")
    wait(
        lambda: (
            client.history(thread_id)[-1].kind == "assistant"
            and client.thread(thread_id).status is ThreadStatus.IDLE
        ),
        "the child's report to reach the parent",
    )

    history = client.history(thread_id)
    assert [i.kind for i in history] == [
        "user",
        "assistant",  # run_build + watch_pull_requests
        "tool_result",  # watch_pull_requests answers at once
        "tool_result",  # run_build, through the callback
        "assistant",  # wait_for_event
        "tool_result",  # woken up by the child's report
        "event",
        "assistant",
    ]
    report = next(i for i in history if isinstance(i, EventShown))
    assert report.original_call_id == watch_id and "PR #42 opened by dana" in report.content
    children = [t for t in client.threads(limit=1000) if t.parent_id == thread_id]
    assert len(children) == 1 and children[0].status is ThreadStatus.CLOSED
    assert any(isinstance(i, EventShown) for i in client.history(children[0].id))

    events = client.events(thread_id)
    assert sum(isinstance(e, ItemAdded) for e in events) == len(history)
    assert {e.name for e in events if isinstance(e, ToolDispatched)} == {
        "run_build",
        "watch_pull_requests",
    }
