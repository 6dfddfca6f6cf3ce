"""A message is stored before its thread is woken: a wake that cannot reach Redis is not
the sender's failure, and the sweeper wakes the thread."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

import pytest
from conftest import Deployment, scaled, wait_until

from dormant.client import Client
from dormant.messages import AssistantTurn, UserText


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_send_whose_wake_cannot_reach_redis_returns_and_the_sweeper_wakes_the_thread(
    deploy: Callable[..., Deployment], caplog: pytest.LogCaptureFixture
) -> None:
    d = deploy()
    worker = d.start_worker("w1")
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    thread_id = client.launch("echo", "first")
    wait_until(lambda: len(client.history(thread_id)) == 2, 30, "the first reply")
    nowhere = f"redis://127.0.0.1:{_closed_port()}/0"
    down = Client.from_env({**d.env, "DORMANT_BROKER_URL": nowhere, "DORMANT_REDIS_URL": nowhere})
    d.clients.append(down)

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="dormant.client"):
        message_id = down.send(thread_id, "second", message_id="m-second")

    assert message_id == "m-second"
    assert time.monotonic() - started < scaled(30)
    assert any("the sweeper will wake it" in r.getMessage() for r in caplog.records)
    assert [r.message_id for r in client.store.inbox(thread_id)][-1] == "m-second"
    wait_until(lambda: len(client.history(thread_id)) == 4, 60, "the sweeper to wake the thread")
    history = client.history(thread_id)
    assert history[2] == UserText(text="second") and isinstance(history[3], AssistantTurn)
