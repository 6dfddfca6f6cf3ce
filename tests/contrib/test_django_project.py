"""Django projects driven by their own commands: ``manage.py test`` on PostgreSQL,
``manage.py dormant ...`` on the project's database, and a new project built from
docs/django.md's blocks exactly as written."""

from __future__ import annotations

import re
import secrets
import sys
from pathlib import Path

import pytest

from tests.contrib.projects import (
    REDIS_URL,
    ROOT,
    Project,
    database_exists,
    doc_files,
    postgres_database,
    watched_broker,
)

pytest.importorskip("django")
pytestmark = pytest.mark.timeout(600)  # each command starts Django on a busy machine

EXAMPLE = ROOT / "examples" / "django_app"
SETTINGS = "proj.settings"


def _example(database: str) -> Project:
    return Project(
        EXAMPLE,
        {"SHOP_DATABASE": database, "SHOP_DORMANT_PREFIX": f"dxt{secrets.token_hex(5)}"},
    )


def test_manage_py_test_on_postgres_drops_its_test_database() -> None:
    with postgres_database("dormant_django_test") as name:
        output = _example(name).run(sys.executable, "manage.py", "test", "--noinput")
        assert re.search(r"Ran \d+ tests?", output) and "OK" in output
        assert "Destroying test database" in output
        assert not database_exists(f"test_{name}")


def test_manage_py_dormant_runs_dormant_commands_on_the_projects_database() -> None:
    with postgres_database("dormant_django_cli") as name:
        project = _example(name)
        manage = (sys.executable, "manage.py", "dormant")
        missing = project.run(*manage, "threads", expect=3)
        assert "`python manage.py dormant db upgrade`" in missing, missing  # as typed here
        project.run(sys.executable, "manage.py", "migrate")
        assert "no threads" in project.run(*manage, "threads")
        # Django's own option, applied by manage.py itself, is not passed on to dormant.
        assert "no threads" in project.run(*manage, "--settings", SETTINGS, "threads")
        assert "no threads" in project.run(*manage, "threads", f"--settings={SETTINGS}")
        upgraded = project.run(*manage, "db", "upgrade")
        assert f"schema of postgresql://postgres@127.0.0.1:5432/{name} is up to date" in upgraded
        refused = project.run(*manage, "launch", "suport", "hello", expect=1)
        assert "suport" in refused and "support" in refused  # DORMANT["AGENTS"] is read
        worker = project.run(*manage, "worker", expect=2)  # a wrong command line
        assert "celery -A <your Celery app> worker" in worker
        assert "Usage: python manage.py dormant" in project.run(*manage, "--help")


def test_a_new_project_built_from_django_md_migrates_tests_and_runs_dormant(
    tmp_path: Path,
) -> None:
    project = Project(tmp_path, {})
    project.run("django-admin", "startproject", "proj", ".")
    project.run(sys.executable, "manage.py", "startapp", "myapp")
    files = doc_files("django.md")
    assert [f.path for f in files] == [
        "proj/settings.py",
        "myapp/agents.py",
        "proj/celery.py",
        "proj/__init__.py",
        "myapp/models.py",
        "myapp/views.py",
        "proj/urls.py",
        "myapp/tests.py",
    ]
    with postgres_database("dormant_django_doc") as name:
        project.write(files)
        settings = tmp_path / "proj" / "settings.py"
        written = settings.read_text()
        assert '"NAME": "proj",' in written
        settings.write_text(written.replace('"NAME": "proj",', f'"NAME": "{name}",'))
        # DORMANT_SECRET_KEY is not exported: the doc says these commands need none.
        run = (sys.executable, "manage.py")
        project.run(*run, "makemigrations", "myapp")
        assert "dormant: schema is at its newest migration" in project.run(*run, "migrate")
        assert "no threads" in project.run(*run, "dormant", "threads")
        assert "OK" in project.run(*run, "test", "--noinput")
        assert not database_exists(f"test_{name}")
        refused = project.run(*run, "dormant", "launch", "suport", "hi", expect=1)
        assert "suport" in refused


def test_a_mistyped_agent_launched_from_django_is_refused_at_once(tmp_path: Path) -> None:
    project = Project(tmp_path, {})
    (tmp_path / "myagents.py").write_text(
        "from dormant import Agent\n\nsupport = Agent('support', model='openai:gpt-4.1-mini')\n"
    )
    output = project.run(sys.executable, "-c", _LAUNCH_A_MISTYPED_AGENT)
    assert "refused: unknown agent 'suport'" in output and "support" in output
    assert not (tmp_path / "shop.db").exists()  # nothing was stored


_LAUNCH_A_MISTYPED_AGENT = """
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["dormant.contrib.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "shop.db"}},
    DORMANT={"AGENTS": "myagents", "SECRET_KEY": "s", "REDIS_URL": "redis://127.0.0.1:1/0"},
)
django.setup()

from celery import Celery

import dormant.contrib.django
from dormant.errors import UnknownAgent

app = Celery("proj", broker="redis://127.0.0.1:1/0", set_as_current=False)
dormant.contrib.django.install(app)
try:
    dormant.contrib.django.dormant_client(app).launch_on_commit("suport", "hi")
except UnknownAgent as error:
    print("refused:", error)
"""


def test_manage_py_dormant_launch_wakes_the_thread_through_the_projects_celery_app(
    tmp_path: Path,
) -> None:
    """``manage.py dormant launch`` sends its wake through the Celery app ``install`` was
    given, with the broker options its workers read (here a ``global_keyprefix``), not
    through a Celery app of its own built from ``CELERY_BROKER_URL`` alone."""
    prefix = f"ddj{secrets.token_hex(5)}"
    thread_id = f"thr_{prefix}"
    (tmp_path / "myagents.py").write_text(
        "from dormant import Agent\n\nsupport = Agent('support', model='openai:gpt-4.1-mini')\n"
    )
    project = Project(
        tmp_path, {"TEST_PREFIX": prefix, "TEST_THREAD": thread_id, "TEST_REDIS": REDIS_URL}
    )
    with watched_broker(prefix, thread_id) as broker:
        assert thread_id in project.run(sys.executable, "-c", _LAUNCH_FROM_MANAGE_PY)
        broker.assert_queued_under_the_prefix_only()


_LAUNCH_FROM_MANAGE_PY = """
import os

import django
from django.conf import settings

prefix = os.environ["TEST_PREFIX"]
settings.configure(
    INSTALLED_APPS=["dormant.contrib.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "shop.db"}},
    CELERY_BROKER_URL=os.environ["TEST_REDIS"],
    DORMANT={"AGENTS": "myagents", "SECRET_KEY": "s", "KEY_PREFIX": prefix},
)
django.setup()

from celery import Celery
from django.core.management import call_command

import dormant.contrib.django

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.broker_transport_options = {"global_keyprefix": f"{prefix}:"}
dormant.contrib.django.install(app)
call_command("migrate", verbosity=0)
call_command("dormant", "launch", "support", "hi", "--thread-id", os.environ["TEST_THREAD"])
"""
