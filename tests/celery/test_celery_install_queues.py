"""``install`` puts dormant's queues in the app's queue table whatever the app reads first.

Celery builds ``app.amqp.queues`` once, from ``task_queues``; a first read of it on an app
not configured yet loads the configuration inside that read. dormant's queues used to be
added to a table built during the load, which the read then replaced with one holding only
the default queue: ``celery -A proj purge`` offered to purge ``celery`` alone, and a
worker started without ``-Q`` depended on ``celeryd_init`` to add them back.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from celery import Celery

from dormant.settings import Settings
from dormant.worker import QUEUES, install

ROOT = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).with_name("celery")
FIRST_READS = ["nothing", "the configuration", "the queue table", "the queue table, before install"]


def _app(pattern: str) -> Celery:
    app = Celery("proj", set_as_current=False)
    if pattern == "conf.update":
        app.conf.update(broker_url="redis://127.0.0.1:6379/9", task_default_queue="proj")
    else:  # proj/celery.py in a Django project: the settings load when first needed
        django_settings = SimpleNamespace(
            CELERY_BROKER_URL="redis://127.0.0.1:6379/9", CELERY_TASK_DEFAULT_QUEUE="proj"
        )
        app.config_from_object(django_settings, namespace="CELERY")
    return app


@pytest.mark.parametrize("pattern", ["conf.update", "config_from_object"])
@pytest.mark.parametrize("first", FIRST_READS)
def test_dormants_queues_are_in_the_queue_table_whatever_the_app_reads_first(
    pattern: str, first: str
) -> None:
    app = _app(pattern)
    if first == "the queue table, before install":
        assert "proj" in app.amqp.queues
    install(app, settings=Settings())
    if first == "the configuration":
        assert app.conf.task_default_queue == "proj"
    table = app.amqp.queues  # for "the queue table", this is the first read
    assert set(table) == {"proj", *QUEUES}
    assert set(table.consume_from) == {"proj", *QUEUES}, "a worker without -Q reads them all"
    assert app.amqp.router.route({}, "dormant.tool")["queue"].name == "dormant.tools"
    assert app.amqp.router.route({}, "proj.other")["queue"].name == "proj"


def test_install_keeps_the_apps_own_queue_declarations() -> None:
    from kombu import Exchange, Queue

    app = Celery("proj", set_as_current=False)
    reports = Queue("reports", Exchange("reports", type="topic"), routing_key="reports.#")
    app.conf.update(broker_url="redis://127.0.0.1:6379/9", task_queues=[reports])
    install(app, settings=Settings())
    table = app.amqp.queues
    assert list(table) == ["reports", *QUEUES]
    assert table["reports"].exchange.type == "topic"
    assert table["reports"].routing_key == "reports.#"


def test_celery_purge_in_the_django_example_offers_dormants_queues_too() -> None:
    """The real ``celery -A proj purge``, answered "no": it lists the queues it would purge
    (reading the queue table is the first thing it does) and touches no broker."""
    done = subprocess.run(
        [str(CELERY), "-A", "proj", "purge"],
        cwd=ROOT / "examples" / "django_app",
        input="n\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    listed = done.stdout + done.stderr
    assert "Aborted" in listed, listed
    assert "queues: celery, dormant.background, dormant.interactive, dormant.tools." in listed
