"""The Celery app's configuration, ``install`` on an existing app, and the dispatcher."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import celery_agents
import pytest
from celery import Celery
from conftest import wait_until

import dormant.worker as worker
from dormant.errors import ConfigurationError
from dormant.settings import Settings
from dormant.stores.base import OutboxRow, Priority, ThreadStatus
from dormant.stores.sql.store import SQLStore, upgrade
from dormant.worker import (
    QUEUES,
    CeleryDispatcher,
    broker_priority,
    broker_transport_options,
    celery_config,
    create_app,
    install,
)
from tests.test_store_contract import enqueue, new_thread
from tests.test_store_retention import consume

DORMANT_TASKS = {"dormant.slice", "dormant.tool", "dormant.sweep"}


@pytest.fixture
def fresh_default_app() -> Iterator[None]:
    worker._default_app.cache_clear()
    yield
    worker._default_app.cache_clear()


def test_the_baseline_is_json_only_with_late_acks_and_task_events() -> None:
    conf = celery_config(Settings(visibility_timeout_s=900.0, broker_key_prefix="p:"))
    assert (
        conf["task_serializer"] == conf["result_serializer"] == conf["event_serializer"] == "json"
    )
    assert conf["accept_content"] == ["json"]
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["worker_send_task_events"] and not conf["task_send_sent_event"]
    assert conf["task_ignore_result"] and conf["result_backend"] is None
    transport = conf["broker_transport_options"]
    assert transport["visibility_timeout"] == 900.0
    assert transport["queue_order_strategy"] == "priority"
    assert transport["global_keyprefix"] == "p:"
    assert [q.name for q in conf["task_queues"]] == list(QUEUES)


def test_a_rabbitmq_broker_gets_publisher_confirms_and_no_redis_transport_options() -> None:
    amqp = Settings(broker_url="amqp://guest:guest@127.0.0.1:5672/prod", visibility_timeout_s=9.0)
    assert celery_config(amqp)["broker_transport_options"] == {"confirm_publish": True}
    redis_only = {"visibility_timeout", "queue_order_strategy", "priority_steps", "sep"}
    assert not redis_only & set(broker_transport_options(amqp))
    # RabbitMQ orders a queue by priority only if it is declared with x-max-priority.
    assert all(q.max_priority == 9 for q in celery_config(amqp)["task_queues"])


def test_a_redis_key_prefix_on_a_rabbitmq_broker_is_refused_not_ignored() -> None:
    settings = Settings(broker_url="amqp://127.0.0.1:5672//", broker_key_prefix="p:")
    with pytest.raises(ConfigurationError, match="virtual host"):
        celery_config(settings)


def test_importing_the_worker_reads_nothing_until_the_app_is_asked_for(
    monkeypatch: pytest.MonkeyPatch, fresh_default_app: None
) -> None:
    monkeypatch.setenv("DORMANT_AGENTS", "no_such_agents_module")
    with pytest.raises(ConfigurationError, match="no_such_agents_module"):
        _ = worker.app  # the first access builds it, from the environment of that moment
    monkeypatch.setenv("DORMANT_AGENTS", "celery_agents")
    app = worker.app
    assert worker.app is app
    assert set(app.tasks) >= DORMANT_TASKS


def test_the_app_needs_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="DORMANT_AGENTS"):
        create_app(Settings())


def _user_app() -> Celery:
    app = Celery("proj", set_as_current=False)
    app.conf.update(
        broker_url="redis://127.0.0.1:6379/9",
        task_default_queue="proj",
        task_serializer="msgpack",
        task_routes={"proj.report": {"queue": "reports"}},
        beat_schedule={"proj.tick": {"task": "proj.tick", "schedule": 60.0}},
    )
    return app


@pytest.mark.parametrize("configured_first", [False, True])
def test_install_adds_dormant_to_an_existing_app_without_changing_its_defaults(
    configured_first: bool,
) -> None:
    app = _user_app()
    if configured_first:
        assert app.conf.task_default_queue == "proj"  # reading the config finalises it
    install(app, celery_agents.AGENTS, settings=Settings(sweep_interval_s=3.0))

    assert app.conf.task_serializer == "msgpack"
    assert app.conf.task_default_queue == "proj"
    assert set(app.tasks) >= DORMANT_TASKS
    assert app.tasks["dormant.slice"].serializer == "json"
    assert app.tasks["dormant.slice"].acks_late
    assert {"proj", *QUEUES} <= set(app.amqp.queues)
    router = app.amqp.router
    assert router.route({}, "proj.report")["queue"].name == "reports"
    assert router.route({}, "dormant.tool")["queue"].name == "dormant.tools"
    assert router.route({}, "proj.other")["queue"].name == "proj"
    # The sweep runs in beat itself (celery/beat_sweep.py): beat publishes no sweep task.
    assert set(app.conf.beat_schedule) == {"proj.tick"}


def test_retention_is_on_beat_only_when_a_retention_period_is_set() -> None:
    quiet = _user_app()
    install(quiet, celery_agents.AGENTS, settings=Settings())
    assert "dormant.prune" not in quiet.conf.beat_schedule
    pruning = _user_app()
    settings = Settings(prune_older_than_s=30 * 86400.0, prune_interval_s=600.0)
    install(pruning, celery_agents.AGENTS, settings=settings)
    entry = pruning.conf.beat_schedule["dormant.prune"]
    assert entry["task"] == "dormant.prune" and entry["schedule"] == 600.0
    assert "dormant.prune" in pruning.tasks
    assert pruning.amqp.router.route({}, "dormant.prune")["queue"].name == "dormant.background"


def test_the_prune_task_deletes_closed_threads_older_than_the_retention_period(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/dormant.db"
    upgrade(url)
    store = SQLStore(url)
    thread_id = new_thread(store).id
    enqueue(store, thread_id, "bye")
    consume(store, thread_id, ThreadStatus.CLOSED)
    app = _user_app()
    settings = Settings(
        database_url=url, prune_older_than_s=0.001, key_prefix="qr", secret_keys=("k",)
    )
    install(app, celery_agents.AGENTS, settings=settings)
    summary = wait_until(
        lambda: (
            (done := app.tasks["dormant.prune"]())
            != "pruned 0 threads, 0 inbox rows, 0 outbox rows, 0 timers"
            and done
        ),
        30,
        "the thread to age past the retention period",
    )
    assert summary == "pruned 1 threads, 1 inbox rows, 0 outbox rows, 0 timers"  # its "bye"
    assert store.threads() == []
    store.close()


def test_priorities_are_inverted_for_redis_which_serves_the_lowest_first() -> None:
    redis_app = Celery("r", set_as_current=False, broker="redis://127.0.0.1:6379/0")
    amqp_app = Celery("a", set_as_current=False, broker="amqp://guest@localhost//")
    assert broker_priority(redis_app, Priority.INTERACTIVE) < broker_priority(
        redis_app, Priority.BACKGROUND
    )
    assert broker_priority(amqp_app, Priority.INTERACTIVE) == Priority.INTERACTIVE


class _Recorder:
    """Stands in for a Celery app: records what would be sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.conf = type("Conf", (), {"broker_url": "redis://127.0.0.1:6379/0"})()

    def send_task(self, name: str, **options: Any) -> None:
        self.sent.append({"name": name, **options})


class _Marks:
    def __init__(self) -> None:
        self.queued: set[str] = set()

    def claim(self, thread_id: str, priority: int = 0) -> bool:
        if thread_id in self.queued:
            return False
        self.queued.add(thread_id)
        return True

    def clear(self, thread_id: str) -> None:
        self.queued.discard(thread_id)


def test_the_dispatcher_routes_by_priority_and_sends_one_wake_while_one_is_queued() -> None:
    app, marks = _Recorder(), _Marks()
    dispatcher = CeleryDispatcher(app, marks)  # type: ignore[arg-type]
    dispatcher.wake("t1", Priority.INTERACTIVE)
    dispatcher.wake("t1", Priority.BACKGROUND)  # a slice of t1 is queued: it drains both
    dispatcher.wake("t2", Priority.BACKGROUND)
    marks.clear("t1")  # t1's slice started
    dispatcher.wake("t1", 0)
    dispatcher.dispatch(OutboxRow(7, "t1", "call_1", "tool", datetime.now(UTC)))

    assert [(s["name"], s["queue"], s["kwargs"]) for s in app.sent] == [
        ("dormant.slice", "dormant.interactive", {"thread_id": "t1"}),
        ("dormant.slice", "dormant.background", {"thread_id": "t2"}),
        ("dormant.slice", "dormant.background", {"thread_id": "t1"}),
        (
            "dormant.tool",
            "dormant.tools",
            {"thread_id": "t1", "call_id": "call_1", "outbox_id": 7, "action": "tool"},
        ),
    ]
    assert all(s["serializer"] == "json" and "priority" in s for s in app.sent)
