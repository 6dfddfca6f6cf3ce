"""Bad input through ``Client``: a clear error naming the culprit, and storage untouched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import Deployment

from dormant.client import Client
from dormant.errors import (
    DuplicateMessage,
    InvalidToken,
    PayloadTooLarge,
    UnknownCall,
    UnknownThread,
)


def _stored(client: Client, thread_id: str) -> tuple[Any, ...]:
    return (
        client.thread(thread_id),
        client.store.inbox(thread_id),
        client.stored_history(thread_id),
        len(client.threads(limit=10_000)),
    )


@pytest.fixture
def client(deploy: Callable[..., Deployment]) -> Client:
    """A client of a deployment with no worker: every accepted message stays queued."""
    return deploy().client()


def test_a_message_for_an_unknown_thread_is_refused(client: Client) -> None:
    before = len(client.threads(limit=10_000))
    with pytest.raises(UnknownThread, match="thr_missing"):
        client.send("thr_missing", "hello")
    with pytest.raises(UnknownThread, match="thr_missing"):
        client.deliver("thr_missing", "call_1", "result")
    with pytest.raises(UnknownThread):
        client.store.inbox("thr_missing")
    assert len(client.threads(limit=10_000)) == before


def test_a_result_for_a_call_never_made_is_refused(client: Client) -> None:
    thread_id = client.launch("echo", "hello")
    before = _stored(client, thread_id)
    with pytest.raises(UnknownCall, match="call_made_up"):
        client.deliver(thread_id, "call_made_up", "green")
    with pytest.raises(UnknownCall, match="call_made_up"):
        client.send_event(thread_id, "call_made_up", "PR #1 opened")
    assert _stored(client, thread_id) == before


def test_a_repeated_message_id_is_refused_by_sql_and_by_the_redis_fast_path(
    client: Client,
) -> None:
    thread_id = client.launch("echo", "hello")
    client.send(thread_id, "first", message_id="delivery-1")
    before = _stored(client, thread_id)
    with pytest.raises(DuplicateMessage, match="delivery-1"):
        client.send(thread_id, "again", message_id="delivery-1")  # only SQL knows it yet
    client.dedup.add(thread_id, ["delivery-1"])  # what a slice does once it applied it
    with pytest.raises(DuplicateMessage, match="delivery-1"):
        client.send(thread_id, "again", message_id="delivery-1")
    assert _stored(client, thread_id) == before


def test_an_oversized_payload_is_refused_before_anything_is_stored(client: Client) -> None:
    thread_id = client.launch("echo", "hello")
    before = _stored(client, thread_id)
    huge = "x" * (client.settings.max_message_bytes + 1)
    with pytest.raises(PayloadTooLarge, match=thread_id):
        client.send(thread_id, huge)
    with pytest.raises(PayloadTooLarge):
        client.deliver(thread_id, "call_1", huge)
    with pytest.raises(PayloadTooLarge):
        client.launch("echo", huge)
    assert _stored(client, thread_id) == before


def test_a_forged_callback_is_refused(client: Client) -> None:
    thread_id = client.launch("echo", "hello")
    before = _stored(client, thread_id)
    url = client.callback_url(thread_id, "call_1")
    with pytest.raises(InvalidToken, match="call_1"):
        client.deliver_callback(url[:-4] + "AAAA", "green")
    with pytest.raises(InvalidToken):
        client.deliver_callback("https://example.com/not/a/callback", "green")
    assert _stored(client, thread_id) == before


def test_a_client_that_knows_the_agents_refuses_text_for_a_busy_reject_thread(
    deploy: Callable[..., Deployment],
) -> None:
    from dormant import Agent
    from dormant.agents import AgentRegistry
    from dormant.errors import ThreadBusy
    from dormant.models import ScriptedModel, reply
    from dormant.stores.redis import RedisLease

    d = deploy()
    strict = Agent("strict", model=ScriptedModel(lambda items: reply("ok")), steering="reject")
    client = Client.from_env(d.env, agents=AgentRegistry([strict]))
    d.clients.append(client)
    thread_id = client.launch("strict", "first")
    lease = RedisLease(d.redis, d.settings.key_prefix)
    token = lease.acquire(thread_id, 30)  # a slice of the thread is running
    assert token is not None
    before = _stored(client, thread_id)
    with pytest.raises(ThreadBusy, match=thread_id):
        client.send(thread_id, "are you done?")
    assert _stored(client, thread_id) == before
    lease.release(thread_id, token)
    client.send(thread_id, "now?")  # accepted once the slice ends
