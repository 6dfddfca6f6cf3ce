"""A database whose schema is behind this dormant (or ahead of it) is refused at every entry
point with both versions and the fix, on SQLite and PostgreSQL: the commands (exit 3), a
worker and beat before they start, ``Client``, ``LocalSystem`` and the Flask extension.
``dormant db upgrade`` still brings an old schema to head; the version is read once. A
schema ahead (a later release migrated it) is said: refused by ``db upgrade`` and
``LocalSystem``, warned of by the rest, which run on as in a rolling upgrade."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

from dormant import Agent, LocalSystem
from dormant.client import Client
from dormant.errors import ConfigurationError
from dormant.models import ScriptedModel, reply
from dormant.settings import Settings
from dormant.stores.memory.sync import MemoryDedup
from dormant.stores.redis import RedisEvents, redis_client
from dormant.stores.sql import SQLStore, make_engine, upgrade
from tests.test_cli_errors import CELERY, REFUSED, Ran, run

BEHIND = "0009"
HEAD = "0015"
AHEAD = "0099"
BEHIND_SAYS = f"the schema is at {BEHIND}, this dormant needs {HEAD}: run `dormant db upgrade`"
AHEAD_SAYS = f"the schema is at {AHEAD}, newer than this dormant knows (it needs {HEAD})"
UPGRADE_DORMANT = ": a later release migrated this database; upgrade dormant to that release"
SECRET = {"DORMANT_SECRET_KEY": "k" * 32}


def _migrate(url: str, revision: str) -> None:
    from alembic import command

    from dormant.stores.sql.migrate import alembic_config

    command.upgrade(alembic_config(make_url(url), ""), revision)


def _stamp(url: str, revision: str) -> None:
    """As a later release would leave it: its own revision in the version table."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE dormant_alembic_version SET version_num = :v"), {"v": revision}
            )
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'versions.db'}"
        return
    from tests.conftest import _unavailable
    from tests.databases import empty_database

    with empty_database("dormant_versions", _unavailable) as url:
        yield url


@pytest.fixture
def behind_url(empty_url: str) -> str:
    """A database migrated by the release before this one."""
    _migrate(empty_url, BEHIND)
    return empty_url


@pytest.fixture
def ahead_url(empty_url: str) -> str:
    """A database a later release migrated past this one's head."""
    upgrade(empty_url)
    _stamp(empty_url, AHEAD)
    return empty_url


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    path = tmp_path / "cwd"
    path.mkdir()
    return path


def _error_line(ran: Ran) -> str:
    assert ran.code == REFUSED, (ran.code, ran.out, ran.err)
    assert "Traceback" not in ran.err, ran.err
    return ran.err.strip().splitlines()[-1]


def _agent() -> Agent:
    return Agent("calc", model=ScriptedModel(lambda _items: reply("ok")))


def test_the_revisions_known_without_alembic_are_alembics() -> None:
    from alembic.script import ScriptDirectory

    from dormant.stores.sql.migrate import alembic_config
    from dormant.stores.sql.versions import known_revisions, schema_head

    scripts = ScriptDirectory.from_config(alembic_config(make_url("sqlite://"), ""))
    walked = [s.revision for s in scripts.walk_revisions()]
    assert list(known_revisions()) == sorted(walked)
    assert schema_head() == scripts.get_current_head() == HEAD


@pytest.mark.parametrize(
    "command",
    [
        ["threads"],
        ["show", "thr_x"],
        ["check"],
        ["launch", "calc", "hi"],
        ["send", "thr_x", "hi"],
        ["worker", "--agents", "dormant.demo"],
        ["beat"],
        ["serve", "--port", "0"],
    ],
)
def test_every_command_on_a_schema_behind_names_both_versions_and_exits_3(
    cwd: Path, behind_url: str, command: list[str]
) -> None:
    ran = run(cwd, *command, DORMANT_DATABASE_URL=behind_url, **SECRET)
    assert _error_line(ran) == f"error: {BEHIND_SAYS}"


def test_a_celery_worker_on_a_schema_behind_refuses_to_start(
    cwd: Path, tmp_path: Path, behind_url: str
) -> None:
    agents = tmp_path / "agents_dir"
    agents.mkdir()
    (agents / "schema_agents.py").write_text(
        "from dormant import Agent\n"
        "from dormant.models import ScriptedModel, reply\n"
        "calc = Agent('calc', model=ScriptedModel(lambda items: reply('ok')))\n"
    )
    ran = run(
        cwd,
        *("-A", "dormant.worker", "worker", "-P", "threads"),
        program=CELERY,
        DORMANT_AGENTS="schema_agents",
        DORMANT_DATABASE_URL=behind_url,
        PYTHONPATH=str(agents),
        **SECRET,
    )
    assert ran.code != 0 and "Traceback" not in ran.err
    assert ran.err.strip().splitlines()[-1] == f"error: {BEHIND_SAYS}"
    assert "ready." not in ran.err  # it never started consuming


def test_a_celery_beat_on_a_schema_behind_refuses_to_start(cwd: Path, behind_url: str) -> None:
    ran = run(
        cwd,
        *("-A", "dormant.worker", "beat", "-s", str(cwd.parent / "beat-schedule")),
        program=CELERY,
        DORMANT_DATABASE_URL=behind_url,
    )
    assert ran.code != 0 and "Traceback" not in ran.err
    # Beat logs it as a line of its own: "[<time>: WARNING/MainProcess] error: ...".
    assert ran.err.strip().splitlines()[-1].endswith(f"] error: {BEHIND_SAYS}")


def test_db_upgrade_brings_a_schema_behind_to_head_and_the_commands_work_again(
    cwd: Path, behind_url: str
) -> None:
    upgraded = run(cwd, "db", "upgrade", DORMANT_DATABASE_URL=behind_url)
    assert upgraded.code == 0, upgraded.err
    said, done = upgraded.out.splitlines()
    assert said == f"migrated the schema from {BEHIND} to {HEAD}"
    assert done.endswith("is up to date")
    listed = run(cwd, "threads", DORMANT_DATABASE_URL=behind_url)
    assert (listed.code, listed.out.strip()) == (0, "no threads")
    again = run(cwd, "db", "upgrade", DORMANT_DATABASE_URL=behind_url)
    assert again.out.strip().endswith("is up to date") and "\n" not in again.out.strip()


def test_db_upgrade_says_it_created_the_schema_of_an_empty_database(
    cwd: Path, empty_url: str
) -> None:
    created = run(cwd, "db", "upgrade", DORMANT_DATABASE_URL=empty_url)
    assert created.code == 0, created.err
    said, done = created.out.splitlines()
    assert said == f"created the schema at {HEAD}"
    assert done.endswith("is up to date")


def test_db_upgrade_names_a_schema_ahead_as_newer_and_a_read_command_warns_of_it(
    cwd: Path, ahead_url: str
) -> None:
    refused = run(cwd, "db", "upgrade", DORMANT_DATABASE_URL=ahead_url)
    assert _error_line(refused) == f"error: {AHEAD_SAYS}{UPGRADE_DORMANT}"
    listed = run(cwd, "threads", DORMANT_DATABASE_URL=ahead_url)
    assert (listed.code, listed.out.strip()) == (0, "no threads")  # as in a rolling upgrade
    assert listed.err.strip() == f"warning: {AHEAD_SAYS}{UPGRADE_DORMANT}"


def test_a_client_refuses_to_be_built_on_a_schema_behind(behind_url: str) -> None:
    settings = Settings.from_env({}, database_url=behind_url)
    with pytest.raises(ConfigurationError) as from_env:
        Client.from_env({"DORMANT_DATABASE_URL": behind_url})
    assert str(from_env.value) == BEHIND_SAYS
    with pytest.raises(ConfigurationError, match="schema is at 0009"):
        Client.from_celery(Celery("host", set_as_current=False), settings)  # Django's
    store = SQLStore(behind_url)
    events = RedisEvents(redis_client(settings), "versions", ttl_s=60.0)  # never reached
    try:
        with pytest.raises(ConfigurationError, match="schema is at 0009"):
            Client(store, MemoryDedup(), settings, waker=lambda *_: True, events=events)
    finally:
        store.close()


def test_a_store_on_a_schema_ahead_runs_on_and_logs_it_once(
    ahead_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLStore(ahead_url)
    try:
        with caplog.at_level(logging.WARNING, logger="dormant.sql"):
            for _ in range(3):
                assert store.threads(None, 10) == []
    finally:
        store.close()
    assert [r.getMessage() for r in caplog.records] == [AHEAD_SAYS + UPGRADE_DORMANT]


def test_local_system_brings_a_schema_behind_to_head_but_refuses_one_ahead(
    empty_url: str,
) -> None:
    _migrate(empty_url, BEHIND)
    with LocalSystem([_agent()], empty_url, workers=1) as local:
        thread_id = local.launch("calc", "hi")
        local.run_until_idle(timeout_s=30)
        assert local.thread(thread_id).status.value == "idle"
    _stamp(empty_url, AHEAD)
    with pytest.raises(ConfigurationError, match=f"schema is at {AHEAD}, newer"):
        LocalSystem([_agent()], empty_url, workers=1)


def test_local_system_on_a_store_behind_refuses_to_start(behind_url: str) -> None:
    store = SQLStore(behind_url)
    try:
        with pytest.raises(ConfigurationError, match="schema is at 0009, this dormant needs"):
            LocalSystem([_agent()], store=store, workers=1)
    finally:
        store.close()


def test_the_flask_extension_refuses_to_build_its_client_on_a_schema_behind(
    behind_url: str,
) -> None:
    flask = pytest.importorskip("flask")
    from dormant.contrib.flask import Dormant

    app = flask.Flask("schema")
    app.config["SQLALCHEMY_DATABASE_URI"] = behind_url
    app.config["DORMANT"] = {"SECRET_KEY": "k" * 32}
    ext = Dormant(app)
    with pytest.raises(ConfigurationError, match="schema is at 0009"):
        ext.client(app)


def test_a_store_reads_the_schema_version_once_for_all_its_transactions(
    empty_url: str,
) -> None:
    upgrade(empty_url)
    store = SQLStore(empty_url)
    reads: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "dormant_alembic_version" in statement:
            reads.append(statement)

    event.listen(store._engine, "before_cursor_execute", count)
    try:
        for _ in range(5):
            store.threads(None, 10)
        assert len(reads) == 1
    finally:
        store.close()


def test_a_client_is_built_before_the_first_migration_and_refused_at_its_first_write(
    empty_url: str,
) -> None:
    settings = Settings.from_env({}, database_url=empty_url)
    store = SQLStore(empty_url)
    events = RedisEvents(redis_client(settings), "versions", ttl_s=60.0)  # never reached
    try:
        client = Client(store, MemoryDedup(), settings, waker=lambda *_: True, events=events)
        with pytest.raises(ConfigurationError, match="no dormant tables"):
            client.threads()
        upgrade(empty_url)  # the application migrates after it started: the client works
        assert client.threads() == []
    finally:
        store.close()
