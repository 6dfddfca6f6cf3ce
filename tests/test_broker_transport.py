"""A worker that loses its Redis broker with messages unacknowledged reconnects instead of
stopping on kombu's ``'NoneType' object has no attribute 'hostname'``; a worker stopped by
an error exits non-zero."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection, Exchange, Queue
from kombu.transport import redis as kombu_redis

from chaos.services import OwnRedis
from dormant import worker as dormant_worker
from dormant.celery import config as celery_config
from dormant.celery.broker import TRANSPORT
from dormant.celery.worker_process import run_worker
from dormant.settings import Settings
from dormant.stores.base import Priority

STALLED_WAKE_BOUND_S = 45.0
"""With 1 s socket timeouts a wake fails in a few seconds (Celery retries a publish 3 times)."""


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("!!! redis-server is not installed")
    server = OwnRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def _collected_with_an_unacked_message(url: str, transport: str | None) -> Any:
    """What Celery's consumer does on a lost broker: ``collect()`` the connection (the
    transport's client becomes None), then close its channel, a message still unacked."""
    conn = Connection(url, transport=transport)
    queue = Queue("q", Exchange("q", type="direct"), routing_key="q")
    with conn.Producer() as producer:
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key="q", declare=[queue])
    received: list[Any] = []
    consumer = conn.Consumer([queue], callbacks=[lambda _b, m: received.append(m)])
    consumer.consume()
    conn.drain_events(timeout=10)
    channel = conn.default_channel
    assert len(channel.qos._delivered) == 1
    conn._do_close_transport()  # the last step of Connection.collect()
    return conn, channel


def test_kombus_own_transport_raises_the_attribute_error_that_stopped_workers(
    own_redis: OwnRedis,
) -> None:
    conn, channel = _collected_with_an_unacked_message(own_redis.url, None)
    assert type(channel) is kombu_redis.Channel
    with pytest.raises(AttributeError, match="hostname"):
        channel.close()
    conn.release()


def test_a_closed_channel_reports_a_connection_error_the_worker_rides_out(
    own_redis: OwnRedis,
) -> None:
    conn, channel = _collected_with_an_unacked_message(own_redis.url, TRANSPORT)
    with pytest.raises(conn.connection_errors):  # Celery's ignore_errors swallows these
        channel.close()
    conn.release()


def test_the_redis_broker_uses_dormants_transport_and_reconnects_for_ever() -> None:
    config = dormant_worker.celery_config(Settings(broker_url="redis://127.0.0.1:6379/0"))
    assert config["broker_transport"] == TRANSPORT
    assert config["broker_connection_max_retries"] is None
    amqp = dormant_worker.celery_config(Settings(broker_url="amqp://guest@127.0.0.1//"))
    assert "broker_transport" not in amqp


def test_flowers_broker_page_counts_the_tasks_queued_on_dormants_redis_broker(
    own_redis: OwnRedis,
) -> None:
    """Flower picks its Broker page's client by the scheme of the app's broker URI; dormant's
    transport made it ``dormant.celery.broker:Transport://...``, so the page and
    ``/api/queues/length`` answered 404 ``'redis' broker is not supported`` (docs/monitoring.md
    says queued tasks are counted there). The URI reads ``redis://`` again; the connection
    keeps dormant's transport."""
    from flower.utils.broker import Broker
    from flower.utils.broker import Redis as FlowerRedis

    from dormant.celery.broker import Transport

    settings = Settings(broker_url=own_redis.url, broker_key_prefix="flower:")
    app = Celery("dormant")
    app.conf.update(dormant_worker.celery_config(settings))
    with app.connection_for_write() as conn:
        uri = conn.as_uri(include_password=True)  # what Flower's get_broker passes
        assert isinstance(conn.transport, Transport)
    app.send_task("dormant.tool", kwargs={}, queue="dormant.tools")
    broker = Broker(
        uri,
        broker_options=app.conf.broker_transport_options,
        broker_use_ssl=app.conf.broker_use_ssl,
    )
    assert isinstance(broker, FlowerRedis)
    queued = asyncio.run(broker.queues(["dormant.tools", "dormant.interactive"]))
    assert queued == [
        {"name": "dormant.tools", "messages": 1},
        {"name": "dormant.interactive", "messages": 0},
    ]


@pytest.mark.filterwarnings("ignore::celery.exceptions.SecurityWarning")  # CI runs as root
def test_a_worker_stopped_by_an_error_exits_non_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``run_worker`` returns the worker's exit code (``worker_main`` dropped it). Its
    database is migrated: a worker refuses to start on one without dormant's schema."""
    from celery.apps.worker import Worker

    from dormant.stores.sql.store import upgrade

    def stopped_on_an_error(worker: Worker) -> None:
        worker.exitcode = 1

    monkeypatch.setattr(Worker, "start", stopped_on_an_error)
    url = f"sqlite:///{tmp_path}/worker.db"
    upgrade(url)
    settings = Settings(secret_keys=("k",), broker_url="redis://127.0.0.1:6379/0", database_url=url)
    assert run_worker(settings, agents=[]) == 1


def test_a_wake_sent_to_a_stalled_redis_broker_fails_instead_of_waiting(
    own_redis: OwnRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that stops answering without closing its connections (SIGSTOP here; a
    partition in production): kombu's Redis transport has no socket timeout by default, so
    the publish of a ``Client.send`` waited for as long as the broker stalled."""
    monkeypatch.setattr(celery_config, "BROKER_SOCKET_TIMEOUT_S", 1.0)
    monkeypatch.setattr(celery_config, "BROKER_CONNECT_TIMEOUT_S", 1.0)
    settings = Settings(secret_keys=("k",), broker_url=own_redis.url)
    dispatcher = dormant_worker.client_dispatcher(settings, None)
    dispatcher.wake("thr_stalled", Priority.INTERACTIVE)  # connected before the stall
    outcome: list[BaseException | None] = []

    def wake() -> None:
        try:
            dispatcher.wake("thr_stalled", Priority.INTERACTIVE)
            outcome.append(None)
        except Exception as error:
            outcome.append(error)

    own_redis.pause()
    try:
        waking = threading.Thread(target=wake, daemon=True)
        waking.start()
        waking.join(timeout=STALLED_WAKE_BOUND_S)  # a bound, not a wait: it returns sooner
        stalled = waking.is_alive()
    finally:
        own_redis.resume()
    waking.join(timeout=30)
    dispatcher.close_broker()
    assert not stalled, f"the wake still waited for the broker after {STALLED_WAKE_BOUND_S} s"
    assert outcome and isinstance(outcome[0], Exception), outcome


def _clients_built(url: str, transport: str | None, messages: int) -> int:
    """Redis clients a channel builds to publish, receive and acknowledge ``messages``."""
    built = 0
    conn = Connection(url, transport=transport)
    channel = conn.default_channel
    create = channel._create_client

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal built
        if not kwargs.get("asynchronous"):  # the consumer's own BRPOP client is kombu's
            built += 1
        return create(*args, **kwargs)

    channel._create_client = counted
    queue = Queue("q", Exchange("q", type="direct"), routing_key="q")
    with conn.Producer(channel) as producer:
        for n in range(messages):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key="q", declare=[queue])
    received: list[Any] = []
    consumer = conn.Consumer([queue], channel=channel, callbacks=[lambda _b, m: m.ack()])
    consumer.register_callback(lambda body, _m: received.append(body))
    consumer.consume()
    while len(received) < messages:
        conn.drain_events(timeout=10)
    conn.release()
    return built


def test_one_redis_client_serves_a_channels_publishes_and_acknowledgements(
    own_redis: OwnRedis,
) -> None:
    """kombu builds a client (and copies redis-py's response callbacks) for every publish
    and acknowledgement: a tenth of a busy worker's CPU. dormant's channel builds one."""
    assert _clients_built(own_redis.url, None, 20) >= 40
    assert _clients_built(own_redis.url, TRANSPORT, 20) == 1


def test_the_shared_client_follows_the_channels_pool_when_kombu_replaces_it(
    own_redis: OwnRedis,
) -> None:
    conn = Connection(own_redis.url, transport=TRANSPORT)
    channel = conn.default_channel
    with channel.conn_or_acquire() as first:
        first.set("k", "1")
    channel._after_fork()  # what a forked child does: the pools are dropped
    with channel.conn_or_acquire() as second:
        assert second.get("k") == b"1"
    assert second is not first
    assert second.connection_pool is channel.pool
    conn.release()
