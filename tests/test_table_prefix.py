"""``DORMANT_TABLE_PREFIX``: two deployments (or an application and dormant) share one
database, on SQLite and on real PostgreSQL, and never see each other's rows."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from typer.testing import CliRunner

from dormant import Agent, LocalSystem, tool
from dormant.cli import app
from dormant.messages import AssistantTurn, Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.settings import Settings
from dormant.stores.base import NewThread
from dormant.stores.sql.store import VERSION_TABLE, SQLStore, make_engine, upgrade
from dormant.stores.sql.tables import schema
from tests.databases import empty_database

runner = CliRunner()
TABLES = {
    "threads",
    "items",
    "calls",
    "inbox",
    "outbox",
    "timers",
    "pruned_ids",
    "ledger",
    "workers",
    "version_changes",
}


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(f"!!! PostgreSQL UNAVAILABLE, table prefix cases NOT RUN: {reason}")


@pytest.fixture(scope="module")
def shared_postgres() -> Iterator[str]:
    """One real PostgreSQL database, empty at first; each test uses its own prefixes."""
    with empty_database("dormant_prefix", _unavailable) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/shared.db"
    url: str = request.getfixturevalue("shared_postgres")
    return url


def fresh_prefix() -> str:
    return f"t{secrets.token_hex(3)}_"


def table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def script(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText):
        return reply("adding", call("add", a=len(last.text), b=1))
    assert isinstance(last, ToolResult)
    return reply(f"the sum is {last.content}")


def test_two_prefixes_run_agents_in_one_database_without_seeing_each_other(
    database_url: str,
) -> None:
    first, second = fresh_prefix(), fresh_prefix()
    agent = Agent("calc", model=ScriptedModel(script), tools=[add])
    systems = [
        LocalSystem([agent], database_url, settings=Settings(database_url, table_prefix=p))
        for p in (first, second)
    ]
    try:
        systems[0].launch("calc", "hi", thread_id="thr_same")
        systems[0].launch("calc", "only in the first", thread_id="thr_first")
        systems[1].launch("calc", "hello", thread_id="thr_same")  # the same id: no conflict
        for system in systems:
            system.run_until_idle(timeout_s=60)

        assert {t.id for t in systems[0].threads()} == {"thr_same", "thr_first"}
        assert [t.id for t in systems[1].threads()] == ["thr_same"]
        last = systems[0].history("thr_same")[-1]
        assert isinstance(last, AssistantTurn) and last.text == "the sum is 3"
        last = systems[1].history("thr_same")[-1]
        assert isinstance(last, AssistantTurn) and last.text == "the sum is 6"
    finally:
        for system in systems:
            system.close()
    names = table_names(database_url)
    assert {first + t for t in TABLES} | {second + t for t in TABLES} <= names
    assert not TABLES & names  # nothing went to unprefixed tables
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            for prefix, count in ((first, 2), (second, 1)):
                rows = conn.execute(text(f"SELECT count(*) FROM {prefix}threads")).scalar()
                assert rows == count
                calls = conn.execute(text(f"SELECT count(*) FROM {prefix}calls")).scalar()
                assert calls == count  # each thread made one call, in its own tables
    finally:
        engine.dispose()


def test_db_upgrade_with_a_prefix_creates_only_prefixed_tables(database_url: str) -> None:
    prefix = fresh_prefix()
    before = table_names(database_url) if "postgresql" in database_url else set()
    env = {"DORMANT_TABLE_PREFIX": prefix, "DORMANT_DATABASE_URL": database_url}

    done = runner.invoke(app, ["db", "upgrade"], env=env)

    assert done.exit_code == 0, done.output
    assert f"(tables prefixed {prefix!r})" in done.output
    created = table_names(database_url) - before
    assert created == {prefix + t for t in TABLES} | {prefix + VERSION_TABLE}
    engine = make_engine(database_url)
    try:
        inspector = inspect(engine)
        for table in created - {prefix + VERSION_TABLE}:
            for index in inspector.get_indexes(table):
                kind, _, name = str(index["name"]).partition("_")
                assert kind in ("ix", "uq") and name.startswith(prefix), index
    finally:
        engine.dispose()
    listed = runner.invoke(app, ["threads", "--json"], env=env)
    assert listed.exit_code == 0 and listed.output.strip() == "[]"
    other = runner.invoke(app, ["threads"], env={**env, "DORMANT_TABLE_PREFIX": fresh_prefix()})
    assert other.exit_code == 3 and "dormant db upgrade" in other.output


def _differences(url: str, prefix: str) -> list[Any]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            target = schema(prefix).metadata

            def include_name(name: str | None, type_: str, _parents: object) -> bool:
                # Other prefixes' tables in the shared database are not this schema's concern.
                return type_ != "table" or name in target.tables

            options = {
                "version_table": prefix + VERSION_TABLE,
                "compare_type": True,
                "include_name": include_name,
            }
            context = MigrationContext.configure(conn, opts=options)
            return list(compare_metadata(context, target))
    finally:
        engine.dispose()


def test_the_migrations_build_exactly_the_prefixed_tables(database_url: str) -> None:
    prefix = fresh_prefix()
    assert _differences(database_url, prefix) != []
    upgrade(database_url, table_prefix=prefix)
    upgrade(database_url, table_prefix=prefix)  # a no-op the second time
    assert _differences(database_url, prefix) == []


def test_the_cli_reads_only_its_own_prefix(database_url: str) -> None:
    mine, theirs = fresh_prefix(), fresh_prefix()
    for prefix in (mine, theirs):
        upgrade(database_url, table_prefix=prefix)
    store = SQLStore(database_url, table_prefix=theirs)
    try:
        store.create_thread(NewThread(id="thr_theirs", agent="calc"))
    finally:
        store.close()
    env = {"DORMANT_TABLE_PREFIX": mine, "DORMANT_DATABASE_URL": database_url}
    assert runner.invoke(app, ["threads", "--json"], env=env).output.strip() == "[]"
    missing = runner.invoke(app, ["show", "thr_theirs"], env=env)
    assert missing.exit_code == 1 and "unknown thread 'thr_theirs'" in missing.output
    env["DORMANT_TABLE_PREFIX"] = theirs
    shown = runner.invoke(app, ["show", "thr_theirs", "--json"], env=env)
    assert shown.exit_code == 0 and '"id": "thr_theirs"' in shown.output
