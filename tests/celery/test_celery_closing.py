"""Closing a thread tree on real workers: mid-slice, with every kind of pending work."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from conftest import Deployment, wait_until

from dormant.callbacks import callback_app
from dormant.client import Client
from dormant.messages import AssistantTurn, ToolResult
from dormant.ops.check import check_store
from dormant.stores.base import CallState, ThreadStatus


def _calls(client: Client, thread_id: str) -> dict[str, CallState]:
    return {c.name: c.state for c in client.store.load(thread_id).calls.values()}


def test_closing_a_root_mid_slice_stops_its_child_and_settles_every_pending_thing(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_LEASE_TTL_S="3")  # a streaming slice renews its lease every second
    worker = d.start_worker("w1", concurrency=4)
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    root = client.launch("closable", "start")

    def child_streaming() -> bool:
        children = client.store.children(root)
        return bool(children) and d.redis.get(d.key("streaming", children[0].id)) == "1"

    wait_until(child_streaming, 60, "the child to start streaming", check=d.check_alive)
    wait_until(
        lambda: _calls(client, root).get("watch_pull_requests") is CallState.SUBSCRIBED,
        30,
        "the subscription's first result",
        check=d.check_alive,
    )
    (callback,) = d.redis.lrange(d.key("callbacks"), 0, -1)
    (child,) = client.store.children(root)
    assert _calls(client, root)["run_build"] is CallState.PENDING
    assert client.store.next_timer_due() is not None

    closed = client.close_thread(root, reason="the operator stopped it")

    assert closed.status is ThreadStatus.CLOSED
    wait_until(
        lambda: d.redis.get(d.key("stopped", child.id)) is not None,
        15,  # a renewal comes every second: far sooner than the 30 s stream ends
        "the child's slice to stop streaming",
        check=d.check_alive,
    )
    assert d.redis.get(d.key("stopped", child.id)) == "LeaseLost"
    assert client.thread(child.id).status is ThreadStatus.CLOSED
    assert not any(isinstance(i, AssistantTurn) for i in client.store.own_items(child.id))
    calls = _calls(client, root)
    assert calls["run_build"] is CallState.ANSWERED  # with "Not answered: ... closed first."
    assert calls["watch_pull_requests"] is CallState.CANCELLED
    assert client.store.next_timer_due() is None
    errors = [i for i in client.history(root) if isinstance(i, ToolResult) and i.is_error]
    assert {e.name for e in errors} >= {"run_build", "sleep"}

    with httpx.Client(
        transport=httpx.WSGITransport(app=callback_app(client)), base_url="http://cb"
    ) as http:
        path = "/" + callback.split("/", 3)[3]
        late = http.post(path, json={"result": "build green", "message_id": "ci-1"})
    assert late.status_code == 409
    assert "is closed (the operator stopped it)" in late.json()["error"]

    wait_until(
        lambda: check_store(client.store) == [],
        30,
        "dormant check to find nothing (the cancel row run)",
        check=d.check_alive,
        detail=lambda: str(check_store(client.store)),
    )
