"""``dormant worker -n`` expands a node name's ``%h``, ``%n`` and ``%d`` as Celery's own
command line does: the name a real worker answers ``celery inspect ping`` with."""

from __future__ import annotations

import socket
from collections.abc import Callable

from celery import Celery
from conftest import REDIS_URL, Deployment, wait_until


def test_dormant_worker_expands_the_host_its_first_label_and_its_domain_in_its_node_name(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_AGENTS="")
    pattern = f"w1-%n-%d.{d.prefix}@%h"
    worker = d.start_cli(
        "w1", "worker", "--agents", "celery_agents", "-c", "2", "-l", "warning", "-n", pattern
    )
    d.wait_ready(worker)
    host = socket.gethostname()
    first_label, _, domain = host.partition(".")
    inspector = Celery("inspect", set_as_current=False)
    inspector.conf.update(
        broker_url=REDIS_URL,
        broker_transport_options={"global_keyprefix": d.env["DORMANT_BROKER_KEY_PREFIX"]},
    )
    try:

        def names() -> set[str] | None:
            return set(inspector.control.inspect(timeout=2).ping() or {}) or None

        answered = wait_until(names, 60, "the worker to answer ping", check=d.check_alive)
    finally:
        inspector.close()
    assert answered == {f"w1-{first_label}-{domain}.{d.prefix}@{host}"}
