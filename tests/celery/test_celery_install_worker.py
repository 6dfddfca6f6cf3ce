"""``install`` on an existing app: a plain ``celery -A proj worker`` runs dormant's agents.

Celery 5 fixes the queues a worker consumes when it builds its queue table; the test reads
what a real worker process says it listens on, not the app's configuration.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery import Celery
from conftest import REDIS_URL, Deployment, wait_until

from dormant.messages import AssistantTurn

QUEUES = {"proj", "dormant.interactive", "dormant.background", "dormant.tools"}


@pytest.fixture
def proj_worker(deploy: object) -> Iterator[tuple[Deployment, str]]:
    deployment: Deployment = deploy()  # type: ignore[operator]
    name = f"proj.{deployment.prefix}@localhost"
    # Exactly what a user runs, plus a hostname to inspect and quiet logs: no -Q, no -P.
    argv = ["-A", "proj_app", "worker", "-c", "2", "-n", name, "-l", "warning"]
    deployment._start("proj", argv, {"TEST_WORKER_ID": "proj"})
    deployment.wait_ready(deployment.procs[0], timeout_s=90)
    yield deployment, name


def _inspector(deployment: Deployment) -> Celery:
    app = Celery("inspect", set_as_current=False)
    app.conf.update(
        broker_url=REDIS_URL,
        broker_transport_options={"global_keyprefix": deployment.env["DORMANT_BROKER_KEY_PREFIX"]},
    )
    return app


def test_a_worker_started_without_queues_listens_on_dormants_and_its_own(
    proj_worker: tuple[Deployment, str],
) -> None:
    deployment, name = proj_worker
    app = _inspector(deployment)

    def queues() -> set[str] | None:
        answer = app.control.inspect(destination=[name], timeout=2).active_queues() or {}
        return {q["name"] for q in answer.get(name, [])} or None

    assert wait_until(queues, 60, "the worker to answer active_queues") == QUEUES
    app.close()


def test_an_agent_and_the_projects_own_task_both_run_on_that_worker(
    proj_worker: tuple[Deployment, str],
) -> None:
    deployment, _ = proj_worker
    client = deployment.client()
    thread_id = client.launch("calc", "add two and three")

    def answered() -> bool:
        return any(
            isinstance(item, AssistantTurn) and item.text == "done: 5"
            for item in client.history(thread_id)
        )

    wait_until(answered, 90, "the calc agent to finish", check=deployment.check_alive)

    app = _inspector(deployment)
    app.send_task("proj.record", args=["ran"], queue="proj")
    key = f"{deployment.prefix}:test:proj"
    wait_until(lambda: deployment.redis.lrange(key, 0, -1) == ["ran"], 60, "proj.record to run")
    app.close()


@pytest.mark.parametrize(
    ("include", "exclude", "consumed"),
    [
        ((), (), QUEUES),
        (("proj",), (), {"proj"}),
        ((), ("dormant.tools",), QUEUES - {"dormant.tools"}),
    ],
)
def test_the_worker_options_still_choose_among_the_installed_queues(
    include: tuple[str, ...], exclude: tuple[str, ...], consumed: set[str]
) -> None:
    """What a worker does at start (``celeryd_init``, then ``setup_queues`` with ``-Q`` and
    ``-X``), on an installed app whose queue table was built as its configuration loaded."""
    from celery.signals import celeryd_init
    from celery_agents import AGENTS

    from dormant.settings import Settings
    from dormant.worker import install

    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="redis://127.0.0.1:6379/9", task_default_queue="proj")
    install(app, AGENTS, settings=Settings())
    assert "proj" in app.amqp.queues  # the first read of the table loads the configuration
    celeryd_init.send(sender="w@h", instance=SimpleNamespace(app=app), conf=app.conf, options={})
    app.amqp.queues.select(list(include))
    app.amqp.queues.deselect(list(exclude))
    assert set(app.amqp.queues.consume_from) == consumed
