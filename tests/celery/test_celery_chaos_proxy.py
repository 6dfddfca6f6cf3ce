"""The chaos run's broker drop: a proxy in front of the broker's Redis loses the next slice or
tool task published once a drop is armed, and passes everything else on.

Tasks are sent as a client sends them (``client_dispatcher``) to a ``redis-server`` of the
test's own, through ``chaos.proxy.BrokerProxy``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from conftest import scaled, wait_until

from chaos.proxy import DROP_ARMED, LOST_KEY, BrokerProxy, encode_command, parse_command
from chaos.services import OwnRedis
from dormant.celery.config import (
    QUEUE_BACKGROUND,
    SLICE_TASK,
    SWEEP_TASK,
    TOOL_TASK,
    celery_config,
)
from dormant.celery.dispatch import CeleryDispatcher, client_dispatcher
from dormant.celery.producer_app import ProducerApp
from dormant.settings import Settings
from dormant.stores.base import OutboxRow, Priority

PREFIX = "proxytest:broker:"


@pytest.fixture
def proxy(own_redis: OwnRedis, tmp_path: Path) -> Iterator[BrokerProxy]:
    proxy = BrokerProxy(tmp_path / "proxy", own_redis.port, own_redis.url)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def settings(proxy: BrokerProxy) -> Settings:
    return Settings(broker_url=proxy.url, broker_key_prefix=PREFIX)


@pytest.fixture
def dispatcher(settings: Settings) -> Iterator[CeleryDispatcher]:
    sender = client_dispatcher(settings, None)
    yield sender
    sender.close_broker()


def send_a_sweep(settings: Settings) -> None:
    """What beat sends every ``sweep_interval_s``."""
    app = ProducerApp("beat-like", set_as_current=False)
    app.conf.update(celery_config(settings))
    try:
        app.send_task(SWEEP_TASK, queue=QUEUE_BACKGROUND, serializer="json")
    finally:
        app.pool.force_close_all()
        app.close()


def queued(server: OwnRedis) -> int:
    """Task messages waiting on the dormant queues (every priority list)."""
    client = server.client()
    try:
        return sum(int(client.llen(key)) for key in client.scan_iter(match=f"{PREFIX}dormant.*"))
    finally:
        client.close()


def lost(server: OwnRedis) -> int:
    client = server.client()
    try:
        return int(client.llen(LOST_KEY))
    finally:
        client.close()


class Drop:
    """A drop armed in the background, as the chaos run's fault arms it."""

    def __init__(self, proxy: BrokerProxy, server: OwnRedis, name: str, within_s: float) -> None:
        self.result: list[str | None] = []
        self._thread = threading.Thread(
            target=lambda: self.result.append(proxy.drop_next_task(name, within_s))
        )
        self._thread.start()
        armed = server.client()
        try:
            wait_until(lambda: armed.exists(DROP_ARMED), 10, "the drop to be armed")
        finally:
            armed.close()

    def outcome(self) -> str | None:
        self._thread.join(timeout=scaled(30))
        [result] = self.result
        return result


def test_an_armed_drop_loses_the_next_slice_wake_and_its_sender_sees_a_success(
    proxy: BrokerProxy, own_redis: OwnRedis, dispatcher: CeleryDispatcher
) -> None:
    drop = Drop(proxy, own_redis, SLICE_TASK, within_s=scaled(30))
    dispatcher.wake("thr_dropped", Priority.INTERACTIVE)  # returns: the broker replied
    assert drop.outcome() == "dormant.slice {'thread_id': 'thr_dropped'}"
    assert (queued(own_redis), lost(own_redis)) == (0, 1)
    dispatcher.wake("thr_next", Priority.INTERACTIVE)
    assert (queued(own_redis), lost(own_redis)) == (1, 1)  # one drop loses one task


def test_a_drop_armed_for_a_tool_task_passes_slice_wakes_on_and_loses_the_tool_task(
    proxy: BrokerProxy, own_redis: OwnRedis, dispatcher: CeleryDispatcher
) -> None:
    drop = Drop(proxy, own_redis, TOOL_TASK, within_s=scaled(30))
    dispatcher.wake("thr_tool", Priority.BACKGROUND)
    dispatcher.dispatch(OutboxRow(7, "thr_tool", "call_1", "tool", datetime.now(UTC)))
    outcome = drop.outcome()
    assert outcome is not None and outcome.startswith("dormant.tool ")
    assert "'outbox_id': 7" in outcome
    assert (queued(own_redis), lost(own_redis)) == (1, 1)  # the wake is queued


def test_a_drop_passes_a_sweep_on_and_misses_when_no_slice_or_tool_task_comes(
    proxy: BrokerProxy, own_redis: OwnRedis, settings: Settings, dispatcher: CeleryDispatcher
) -> None:
    drop = Drop(proxy, own_redis, SLICE_TASK, within_s=1.0)
    send_a_sweep(settings)
    assert drop.outcome() is None
    assert (queued(own_redis), lost(own_redis)) == (1, 0)
    dispatcher.wake("thr_after", Priority.BACKGROUND)  # a missed drop is disarmed
    assert (queued(own_redis), lost(own_redis)) == (2, 0)


def test_clients_reach_redis_through_the_proxy_again_after_it_restarts(
    proxy: BrokerProxy, own_redis: OwnRedis
) -> None:
    client = redis.Redis.from_url(proxy.url, socket_timeout=5)
    try:
        client.set("k", "before")
        own_redis.restart()  # every key is gone, every connection cut
        wait_until(lambda: client.get("k") is None, 10, "the restarted Redis to answer")
    finally:
        client.close()


def test_a_command_split_across_reads_is_parsed_once_it_is_complete() -> None:
    command = encode_command([b"LPUSH", b"dormant.tools", b"x\r\ny"])
    assert command == b"*3\r\n$5\r\nLPUSH\r\n$13\r\ndormant.tools\r\n$4\r\nx\r\ny\r\n"
    assert all(parse_command(command[:cut]) is None for cut in range(1, len(command)))
    assert parse_command(command + b"*1") == ([b"LPUSH", b"dormant.tools", b"x\r\ny"], len(command))
    with pytest.raises(ValueError, match="not a RESP array"):
        parse_command(b"PING\r\n")
