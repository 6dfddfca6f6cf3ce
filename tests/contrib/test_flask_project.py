"""Flask apps: ``flask dormant ...`` with the app's configuration, the client refusing a
mistyped agent at launch, and a new app factory built from docs/flask.md's blocks."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask import Flask

from dormant import Agent
from dormant.contrib.flask import Dormant
from dormant.errors import UnknownAgent
from dormant.models import ScriptedModel, reply
from tests.contrib.projects import (
    REDIS_URL,
    Project,
    doc_files,
    postgres_database,
    watched_broker,
)

pytest.importorskip("flask_sqlalchemy")

NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens: no test may reach a broker


def _support() -> Agent:
    return Agent("support", model=ScriptedModel(lambda history: reply("hello")))


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Flask]:
    app = Flask("shop")
    app.config.from_mapping(
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'shop.db'}",
        DORMANT={"SECRET_KEY": "s3cret", "TABLE_PREFIX": "shop_", "BROKER_URL": NOWHERE},
        DORMANT_REDIS_URL=NOWHERE,
    )
    extension = Dormant(app, agents=[_support()])
    yield app
    with app.app_context():
        extension.client().close()


def test_flask_dormant_runs_dormant_commands_with_the_apps_config(
    app: Flask, tmp_path: Path
) -> None:
    runner = app.test_cli_runner()
    upgraded = runner.invoke(args=["dormant", "db", "upgrade"])
    assert upgraded.exit_code == 0, upgraded.output
    assert f"schema of sqlite:///{tmp_path / 'shop.db'} is up to date" in upgraded.output
    assert "tables prefixed 'shop_'" in upgraded.output
    listed = runner.invoke(args=["dormant", "threads"])
    assert (listed.exit_code, listed.output.strip()) == (0, "no threads")
    worker = runner.invoke(args=["dormant", "worker"])
    assert worker.exit_code == 2  # a wrong command line, as an unknown command is
    assert "celery -A <your Celery app> worker" in worker.output
    helped = runner.invoke(args=["dormant", "--help"])
    assert "Usage: flask dormant" in helped.output
    commands = [
        line.split()[0] for line in helped.output.split("Commands:")[1].splitlines() if line
    ]
    assert "threads" in commands and "launch" in commands
    assert "worker" not in commands and "beat" not in commands  # refused here: not offered


def test_a_mistyped_agent_is_refused_at_launch_by_the_flask_client(app: Flask) -> None:
    with app.app_context():
        client = Dormant().client(app)  # the app's, whichever instance asks
        with pytest.raises(UnknownAgent, match=r"'suport'.*support"):
            client.launch("suport", "Where is my order #1")


@pytest.mark.timeout(600)
def test_a_new_app_built_from_flask_md_creates_its_tables_and_runs_dormant(
    tmp_path: Path,
) -> None:
    files = doc_files("flask.md")
    assert [f.path for f in files] == [
        "shop/__init__.py",
        "shop/models.py",
        "shop/agents.py",
        "make_celery.py",
        "shop/views.py",
    ]
    prefix = f"dxn{secrets.token_hex(5)}"
    with postgres_database("dormant_flask_doc") as name:
        project = Project(
            tmp_path,
            {
                "FLASK_SQLALCHEMY_DATABASE_URI": f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}",
                "FLASK_CELERY__broker_url": REDIS_URL,
                "FLASK_CELERY__broker_transport_options": f'{{"global_keyprefix": "{prefix}:"}}',
                "FLASK_DORMANT__KEY_PREFIX": prefix,
            },
        )
        project.write(files)
        flask = ("flask", "--app", "shop")
        try:
            assert "tables are ready" in project.run(*flask, "init-db")
            assert "no threads" in project.run(*flask, "dormant", "threads")
            placed = project.run(sys.executable, "-c", _PLACE_AN_ORDER)
            assert "201 thr_" in placed and "200 thr_" in placed
            thread_id = placed.split()[1]
            assert thread_id in project.run(*flask, "dormant", "threads")
            refused = project.run(*flask, "dormant", "launch", "suport", "hi", expect=1)
            assert "suport" in refused
            project.run(sys.executable, "-c", "import make_celery")
        finally:
            keys = redis.Redis.from_url(REDIS_URL)
            found = list(keys.scan_iter(match=f"{prefix}*", count=1000))
            if found:
                keys.delete(*found)
            keys.close()


_PLACE_AN_ORDER = """
from shop import create_app
web = create_app().test_client()
placed = web.post("/orders/", data={"item": "teapot"})
print(placed.status_code, placed.json["thread_id"])
shown = web.get(f"/threads/{placed.json['thread_id']}/")
print(shown.status_code, placed.json["thread_id"])
"""


def test_a_launch_through_the_flask_client_keeps_its_budget(app: Flask) -> None:
    from dormant import Budget

    runner = app.test_cli_runner()
    assert runner.invoke(args=["dormant", "db", "upgrade"]).exit_code == 0
    with app.app_context():
        client = Dormant().client(app)
        thread_id = client.launch("support", "hi", budget=Budget(max_tokens=1000))
        assert client.thread(thread_id).metadata["budget"] == {
            "max_completions_per_message": 50,
            "max_tokens": 1000,
            "max_cost": None,
        }


def test_flask_dormant_launch_wakes_the_thread_through_the_apps_celery_broker(
    tmp_path: Path,
) -> None:
    """``flask dormant launch`` sends its wake through the app's Celery app, with the
    broker options its workers read (here a ``global_keyprefix``), not through a Celery
    app of its own built from the broker URL alone, whose wake no worker would consume."""
    from celery import Celery

    prefix = f"dfl{secrets.token_hex(5)}"
    celery_app = Celery("shop")
    celery_app.conf.broker_url = REDIS_URL
    celery_app.conf.broker_transport_options = {"global_keyprefix": f"{prefix}:"}
    app = Flask("shop")
    app.config.from_mapping(
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'shop.db'}",
        DORMANT={"SECRET_KEY": "s3cret", "KEY_PREFIX": prefix},
    )
    Dormant(app, celery_app=celery_app, agents=[_support()])
    runner = app.test_cli_runner()
    thread_id = f"thr_{prefix}"
    try:
        with watched_broker(prefix, thread_id) as broker:
            assert runner.invoke(args=["dormant", "db", "upgrade"]).exit_code == 0
            launched = runner.invoke(
                args=["dormant", "launch", "support", "hi", "--thread-id", thread_id]
            )
            assert launched.exit_code == 0, launched.output
            assert launched.output.strip() == thread_id
            broker.assert_queued_under_the_prefix_only()
    finally:
        celery_app.close()
