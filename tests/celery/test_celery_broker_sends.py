"""What a send leaves on the broker, Redis or RabbitMQ; no worker runs.

Within one queue the more urgent wake is served first (kombu's priority lists on Redis,
an ``x-max-priority`` queue on RabbitMQ). On RabbitMQ a send from a process whose pooled
connection the broker has closed (a broker restart, an idle web process's missed
heartbeats) still reaches the queue, once: Celery's publish retry opens a new connection;
and a closed ``Client`` leaves no connection open on the broker.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

import pytest
from celery import Celery
from conftest import BROKERS, Deployment, rabbitmqctl
from kombu import pools

from dormant.client import Client
from dormant.settings import Settings
from dormant.stores.base import Priority
from dormant.worker import QUEUE_BACKGROUND, QUEUE_INTERACTIVE, CeleryDispatcher, celery_config


def _app(settings: Settings) -> Celery:
    app = Celery("broker-sends", set_as_current=False)
    app.conf.update(celery_config(settings))
    return app


def _vhost(d: Deployment) -> str:
    return unquote(urlsplit(d.env["DORMANT_BROKER_URL"]).path[1:])


def _connections(vhost: str) -> list[str]:
    """The names of the open connections to ``vhost``, as RabbitMQ lists them."""
    argv = ["rabbitmqctl", "-q", "list_connections", "-p", vhost, "--no-table-headers", "name"]
    listed = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return listed.stdout.split("\n")[:-1]


def _next_slice(app: Celery, queue: str) -> str | None:
    """The thread id of the next slice message ``queue`` serves (taken off it), or None."""
    with app.connection_for_read() as conn:
        message = app.amqp.queues[queue](conn.default_channel).get(no_ack=True, accept=["json"])
        if message is None:
            return None
        _args, kwargs, _embed = message.decode()
        return str(kwargs["thread_id"])


@pytest.mark.parametrize("broker", BROKERS)
def test_a_more_urgent_wake_is_served_first_within_its_queue(
    deploy: Callable[..., Deployment], broker: str
) -> None:
    d = deploy(broker)
    app = _app(d.settings)
    dispatcher = CeleryDispatcher(app)
    dispatcher.wake("thr_swept", 0)  # the sweeper's re-drive
    dispatcher.wake("thr_result", Priority.BACKGROUND)  # a tool result, sent later
    served = [_next_slice(app, QUEUE_BACKGROUND) for _ in range(3)]
    assert served == ["thr_result", "thr_swept", None]
    app.close()


def test_a_send_after_rabbitmq_closed_the_connection_reaches_the_queue(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy("amqp")
    app = _app(d.settings)
    dispatcher = CeleryDispatcher(app)
    dispatcher.wake("thr_before", Priority.INTERACTIVE)
    assert _next_slice(app, QUEUE_INTERACTIVE) == "thr_before"

    failure = rabbitmqctl("close_all_connections", "--vhost", _vhost(d), "dormant test")
    assert failure is None, failure
    dispatcher.wake("thr_after", Priority.INTERACTIVE)  # on the pooled, closed connection
    assert _next_slice(app, QUEUE_INTERACTIVE) == "thr_after"
    app.close()


def test_closing_a_client_closes_its_rabbitmq_connections(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy("amqp")
    others = set(_connections(_vhost(d)))  # earlier tests' apps in this process keep theirs
    client = Client.from_env(d.env)
    client.launch("echo", "hello")  # the wake opens a connection
    assert set(_connections(_vhost(d))) - others != set()
    client.close()
    assert set(_connections(_vhost(d))) - others == set()


class _Recording(Client):
    """A client that keeps its failed wakes instead of logging them."""

    failed: list[str]

    def wake_failed(self, thread_id: str, error: Exception) -> None:
        self.failed = [*getattr(self, "failed", []), f"{thread_id}: {error!r}"]


@pytest.mark.parametrize("broker", BROKERS)
def test_closing_a_client_leaves_the_other_apps_of_its_process_sending(
    deploy: Callable[..., Deployment], broker: str
) -> None:
    """Celery pools broker connections per process and URL: a closed client must close its
    own, not those of the next client or of the host's app on the same broker."""
    d = deploy(broker)
    # Earlier tests' apps left kombu's process-wide pool for this URL believing queues that
    # their teardown deleted are declared: the host starts from a fresh pool, as in a new process.
    pools.reset()
    host = _app(d.settings)
    host_dispatcher = CeleryDispatcher(host)
    host_dispatcher.wake("thr_host_before", Priority.INTERACTIVE)
    first = _Recording.from_env(d.env)
    first.close()  # it never sent: its pool is made only to be closed
    second = _Recording.from_env(d.env)
    thread_id = second.launch("echo", "hello")
    host_dispatcher.wake("thr_host_after", Priority.INTERACTIVE)
    assert getattr(second, "failed", []) == []
    served = [_next_slice(host, QUEUE_INTERACTIVE) for _ in range(4)]
    assert served == ["thr_host_before", thread_id, "thr_host_after", None]
    second.close()
    host.close()
