"""The real ``dormant`` command on bad input and broken infrastructure: one line, an exit
code, no traceback, no file left behind.

Each case runs the installed console script as a subprocess in an empty directory. Servers
that are "down" are an unused port on 127.0.0.1; the refused and un-migrated PostgreSQL
cases use the real server.
"""

from __future__ import annotations

import os
import secrets
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

from dormant.stores.sql.store import SQLStore, upgrade
from tests.databases import empty_database

DORMANT = Path(sys.executable).with_name("dormant")
CELERY = Path(sys.executable).with_name("celery")
REFUSED = 3
"""The exit code of an unusable deployment (unreachable server, no schema, bad setting)."""


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


DOWN = f"127.0.0.1:{unused_port()}"
"""Nothing listens here: a server that is down."""


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


def run(cwd: Path, *args: str, program: Path = DORMANT, **env: str) -> Ran:
    """The command in ``cwd`` with only the given ``DORMANT_*`` variables (and Redis and
    the broker down unless given)."""
    done = subprocess.run(
        [str(program), *args],
        cwd=cwd,
        env=command_env(**env),
        capture_output=True,
        text=True,
        timeout=90,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


def command_env(**env: str) -> dict[str, str]:
    """This environment without its ``DORMANT_*`` variables, with ``env`` and Redis and
    the broker down unless given."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("DORMANT_")}
    base.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: compiled once, not every run
    base.update(
        {"DORMANT_REDIS_URL": f"redis://{DOWN}/0", "DORMANT_BROKER_URL": f"redis://{DOWN}/0"}
    )
    base.update(env)
    return base


def assert_one_error_line(ran: Ran, code: int, *fragments: str) -> str:
    assert "Traceback" not in ran.out + ran.err, ran.err
    lines = ran.err.strip().splitlines()
    assert len(lines) == 1, ran.err
    assert lines[0].startswith("error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0]
    assert ran.code == code, (ran.code, ran.err)
    assert ran.out == ""
    return lines[0]


@pytest.fixture
def empty_dir(tmp_path: Path) -> Iterator[Path]:
    """The working directory of a case; it must still be empty afterwards."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    yield cwd
    assert sorted(p.name for p in cwd.iterdir()) == []


@pytest.fixture
def migrated(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/migrated.db"
    upgrade(url)
    return url


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(f"!!! PostgreSQL UNAVAILABLE, CLI database cases NOT RUN: {reason}")


@pytest.fixture(scope="module")
def unmigrated_postgres() -> Iterator[str]:
    """A real PostgreSQL database with no tables."""
    with empty_database("dormant_cli", _unavailable) as url:
        yield url


# Bad URLs and settings -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        (["threads"], {"DORMANT_DATABASE_URL": "notaurl"}, "'notaurl' is not a database URL"),
        (["show", "t"], {"DORMANT_DATABASE_URL": "mysql://u:pw@localhost/x"}, "unsupported"),
        (["launch", "a", "hi"], {"DORMANT_BROKER_URL": "notaurl"}, "DORMANT_BROKER_URL="),
        (["launch", "a", "hi"], {"DORMANT_BROKER_URL": "http://u:pw@mq"}, "use redis://"),
        (["send", "t", "hi"], {"DORMANT_REDIS_URL": "http://x"}, "DORMANT_REDIS_URL="),
        (["threads"], {"DORMANT_TABLE_PREFIX": "My-App"}, "table prefix 'My-App'"),
        (["threads"], {"DORMANT_LEASE_TTL_S": "soon"}, "DORMANT_LEASE_TTL_S='soon'"),
        (["db", "upgrade"], {"DORMANT_DATABASE_URL": "notaurl"}, "is not a database URL"),
    ],
)
def test_a_bad_url_or_setting_is_one_line_and_exit_3(
    empty_dir: Path, args: list[str], env: dict[str, str], fragment: str
) -> None:
    line = assert_one_error_line(run(empty_dir, *args, **env), REFUSED, fragment)
    assert "pw" not in line  # passwords are never printed


# Databases that are missing, down or un-migrated --------------------------------------


@pytest.mark.parametrize("command", [["threads"], ["show", "thr_x"]])
def test_a_read_command_never_creates_the_missing_default_sqlite_file(
    empty_dir: Path, command: list[str]
) -> None:
    ran = run(empty_dir, *command)  # DORMANT_DATABASE_URL unset: sqlite:///dormant.db
    assert_one_error_line(ran, REFUSED, "no SQLite database at 'dormant.db'", "db upgrade")


def test_a_write_command_never_creates_a_missing_sqlite_file(empty_dir: Path) -> None:
    ran = run(empty_dir, "launch", "a", "hi", DORMANT_DATABASE_URL="sqlite:///sub/x.db")
    assert_one_error_line(ran, REFUSED, "no SQLite database at 'sub/x.db'")


def test_db_upgrade_into_a_missing_directory_names_the_directory(
    empty_dir: Path, tmp_path: Path
) -> None:
    """docs/deploy.md's ``dormant db upgrade`` on a SQLite file: a missing directory was
    "the database is unreachable: unable to open database file", as if a server were down."""
    missing = tmp_path / "whdoc"
    ran = run(empty_dir, "db", "upgrade", DORMANT_DATABASE_URL=f"sqlite:///{missing}/dormant.db")
    assert_one_error_line(ran, REFUSED, f"its directory '{missing}' does not exist")
    assert not missing.exists()
    missing.mkdir()
    ran = run(empty_dir, "db", "upgrade", DORMANT_DATABASE_URL=f"sqlite:///{missing}/dormant.db")
    assert ran.code == 0
    assert ran.out.splitlines()[-1] == f"schema of sqlite:///{missing}/dormant.db is up to date"


def test_an_unmigrated_sqlite_file_asks_for_db_upgrade(empty_dir: Path, tmp_path: Path) -> None:
    blank = tmp_path / "blank.db"
    blank.touch()
    ran = run(empty_dir, "show", "thr_x", "--database-url", f"sqlite:///{blank}")
    assert_one_error_line(ran, REFUSED, "no dormant tables", "`dormant db upgrade`")
    with sqlite3.connect(blank) as conn:  # still no tables: nothing was created in it
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []


@pytest.mark.parametrize("command", [["threads"], ["db", "upgrade"], ["launch", "a", "hi"]])
def test_a_refused_postgres_connection_is_one_line(empty_dir: Path, command: list[str]) -> None:
    url = f"postgresql://postgres@{DOWN}/dormant"
    ran = run(empty_dir, *command, DORMANT_DATABASE_URL=url)
    assert_one_error_line(ran, REFUSED, "the database is unreachable", DOWN.split(":")[1])


def test_an_unmigrated_postgres_database_asks_for_db_upgrade(
    empty_dir: Path, unmigrated_postgres: str
) -> None:
    for command in (["threads"], ["launch", "a", "hi"]):
        ran = run(empty_dir, *command, DORMANT_DATABASE_URL=unmigrated_postgres)
        assert_one_error_line(ran, REFUSED, "no dormant tables", "`dormant db upgrade`")


def test_a_postgres_database_that_does_not_exist_is_one_line(
    empty_dir: Path, unmigrated_postgres: str
) -> None:
    url = unmigrated_postgres.rsplit("/", 1)[0] + "/dormant_no_such_database"
    ran = run(empty_dir, "threads", "--database-url", url)
    assert_one_error_line(ran, REFUSED, "unreachable", "does not exist")


def test_a_role_without_the_sequences_privilege_is_a_deployment_problem_exit_3(
    empty_dir: Path, postgres_url: str
) -> None:
    """docs/security.md's grants without their second line (``USAGE`` on the sequences):
    the first launch is refused by PostgreSQL, which is the deployment's to fix."""
    role = f"dormant_cli_{secrets.token_hex(4)}"
    admin = create_engine(make_url(postgres_url).set(drivername="postgresql+psycopg"))
    try:
        with admin.begin() as conn:
            conn.execute(text(f"CREATE ROLE {role} LOGIN"))
            conn.execute(
                text(
                    f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"
                )
            )
        url = make_url(postgres_url).set(username=role).render_as_string(hide_password=False)
        ran = run(empty_dir, "launch", "a", "hi", DORMANT_DATABASE_URL=url)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()
    assert_one_error_line(ran, REFUSED, "lacks a privilege", "inbox_id_seq", "docs/security.md")


# Refusals: unknown threads, calls, agents ------------------------------------------------


def test_an_unknown_thread_is_exit_1(empty_dir: Path, migrated: str) -> None:
    for command in (["show", "thr_nope"], ["send", "thr_nope", "hi"]):
        ran = run(empty_dir, *command, DORMANT_DATABASE_URL=migrated)
        assert_one_error_line(ran, 1, "unknown thread 'thr_nope'")


def test_an_unknown_agent_is_refused_before_anything_is_saved(
    empty_dir: Path, tmp_path: Path, migrated: str
) -> None:
    agents = tmp_path / "agents_dir"
    agents.mkdir()
    (agents / "cli_agents.py").write_text(
        "from dormant import Agent\n"
        "from dormant.models import ScriptedModel, reply\n"
        "calc = Agent('calc', model=ScriptedModel(lambda items: reply('ok')))\n"
    )
    env = {"DORMANT_DATABASE_URL": migrated, "PYTHONPATH": str(agents)}
    by_env = run(empty_dir, "launch", "nobody", "hi", DORMANT_AGENTS="cli_agents", **env)
    assert_one_error_line(by_env, 1, "unknown agent 'nobody'", "registered: calc")
    by_flag = run(empty_dir, "launch", "nobody", "hi", "--agents", "cli_agents", **env)
    assert_one_error_line(by_flag, 1, "unknown agent 'nobody'")
    missing = run(empty_dir, "launch", "calc", "hi", DORMANT_AGENTS="no_such_agents", **env)
    assert_one_error_line(missing, REFUSED, "cannot import agents module 'no_such_agents'")
    store = SQLStore(migrated)
    try:
        assert store.threads() == []
    finally:
        store.close()


def test_an_agents_module_that_raises_on_import_is_named_with_its_error_and_exit_3(
    empty_dir: Path, tmp_path: Path, migrated: str
) -> None:
    """A module reading a key its host lacks (``os.environ[...]``) is a configuration
    error, as a missing module is: it was ``unexpected KeyError`` with exit 1."""
    agents = tmp_path / "agents_dir"
    agents.mkdir()
    (agents / "keyed_agents.py").write_text("import os\n\nKEY = os.environ['NO_SUCH_KEY_SET']\n")
    env = {"DORMANT_DATABASE_URL": migrated, "PYTHONPATH": str(agents)}
    env["DORMANT_SECRET_KEY"] = "k" * 32
    said = "the agents module 'keyed_agents' raised KeyError: 'NO_SUCH_KEY_SET'"
    worker = run(empty_dir, "worker", DORMANT_AGENTS="keyed_agents", **env)
    assert_one_error_line(worker, REFUSED, said)
    launch = run(empty_dir, "launch", "calc", "hi", "--agents", "keyed_agents", **env)
    assert_one_error_line(launch, REFUSED, said)


def test_a_reader_that_stops_reading_ends_the_command_quietly_as_click_does(
    empty_dir: Path, migrated: str
) -> None:
    """``dormant show THREAD | head`` whose reader has had enough: Click's own exit 1 with
    nothing said, as ``dormant threads`` did; ``show`` said ``error: unexpected
    BrokenPipeError``."""
    env = command_env(DORMANT_DATABASE_URL=migrated)
    run(empty_dir, "launch", "calc", "hi", "--thread-id", "thr_1", DORMANT_DATABASE_URL=migrated)
    for args in (["show", "thr_1"], ["show", "thr_1", "--json"], ["threads"], ["usage"]):
        with subprocess.Popen(
            [str(DORMANT), *args],
            cwd=empty_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as command:
            assert command.stdout is not None and command.stderr is not None
            command.stdout.close()  # the reader is gone before the command writes
            said = command.stderr.read().decode()
            assert (command.wait(timeout=90), said) == (1, ""), args


# The broker is down after the message is saved ------------------------------------------


def test_launch_with_the_broker_down_prints_the_saved_thread_and_a_retry_adds_nothing(
    empty_dir: Path, migrated: str
) -> None:
    first = run(
        empty_dir, "launch", "calc", "hi", "--thread-id", "thr_1", DORMANT_DATABASE_URL=migrated
    )
    assert first.code == 0 and first.out == "thr_1\n", first.err
    assert "Traceback" not in first.err
    [warning] = first.err.strip().splitlines()
    assert warning.startswith("warning: thread thr_1 is saved; the broker is unreachable")
    assert warning.endswith("the sweeper will wake it")

    again = run(
        empty_dir, "launch", "calc", "hi", "--thread-id", "thr_1", DORMANT_DATABASE_URL=migrated
    )
    assert again.code == 0 and again.out == "thr_1\n"
    other = run(
        empty_dir, "launch", "calc", "bye", "--thread-id", "thr_1", DORMANT_DATABASE_URL=migrated
    )
    assert_one_error_line(other, 1, "thread 'thr_1' was already launched")
    store = SQLStore(migrated)
    try:
        assert [t.id for t in store.threads()] == ["thr_1"]
        assert [r.message_id for r in store.inbox("thr_1")] == ["launch:thr_1"]
    finally:
        store.close()


def test_send_with_the_broker_down_prints_the_message_id(empty_dir: Path, migrated: str) -> None:
    run(empty_dir, "launch", "calc", "hi", "--thread-id", "thr_1", DORMANT_DATABASE_URL=migrated)
    sent = run(
        empty_dir, "send", "thr_1", "more", "--message-id", "m-1", DORMANT_DATABASE_URL=migrated
    )
    assert sent.code == 0 and sent.out == "m-1\n" and "Traceback" not in sent.err
    assert "thread thr_1 is saved" in sent.err
    duplicate = run(
        empty_dir, "send", "thr_1", "more", "--message-id", "m-1", DORMANT_DATABASE_URL=migrated
    )
    assert_one_error_line(duplicate, 1, "'m-1' was already received")


# Workers without a signing key ---------------------------------------------------------


def test_dormant_worker_refuses_to_start_without_a_secret_key(empty_dir: Path) -> None:
    ran = run(empty_dir, "worker", "--agents", "dormant.demo")  # a module that exists
    assert_one_error_line(ran, REFUSED, "DORMANT_SECRET_KEY is not set")


def test_a_celery_worker_refuses_to_start_without_a_secret_key(
    empty_dir: Path, tmp_path: Path
) -> None:
    agents = tmp_path / "agents_dir"
    agents.mkdir()
    (agents / "cli_agents.py").write_text(
        "from dormant import Agent\n"
        "from dormant.models import ScriptedModel, reply\n"
        "calc = Agent('calc', model=ScriptedModel(lambda items: reply('ok')))\n"
    )
    ran = run(
        empty_dir,
        "-A",
        "dormant.worker",
        "worker",
        "-P",
        "threads",
        program=CELERY,
        DORMANT_AGENTS="cli_agents",
        PYTHONPATH=str(agents),
    )
    assert ran.code != 0 and "Traceback" not in ran.err
    # Celery may warn about running as root first; the last line is ours.
    assert ran.err.strip().splitlines()[-1] == (
        "error: DORMANT_SECRET_KEY is not set (under Django or Flask: SECRET_KEY in the "
        "DORMANT settings): callback URLs cannot be signed or verified"
    )
    assert "celery@" not in ran.out  # no banner: the worker never started


def test_a_celery_worker_with_a_bad_setting_says_which_in_one_line(empty_dir: Path) -> None:
    ran = run(
        empty_dir,
        *("-A", "dormant.worker", "worker", "-P", "threads"),
        program=CELERY,
        DORMANT_AGENTS="dormant.demo",
        DORMANT_SWEEP_INTERVAL_S="abc",
    )
    assert ran.code == 1 and "Traceback" not in ran.err, ran.err
    assert (
        ran.err.strip().splitlines()[-1] == "error: DORMANT_SWEEP_INTERVAL_S='abc' is not a number"
    )
    assert "Unable to load celery application" not in ran.err


# --debug, --version ---------------------------------------------------------------------


def test_debug_shows_the_traceback_on_request(empty_dir: Path) -> None:
    for ran in (
        run(empty_dir, "--debug", "threads", DORMANT_DATABASE_URL="notaurl"),
        run(empty_dir, "threads", DORMANT_DATABASE_URL="notaurl", DORMANT_DEBUG="1"),
    ):
        assert ran.code != 0 and "Traceback" in ran.err and "is not a database URL" in ran.err


def test_version_prints_the_installed_version(empty_dir: Path) -> None:
    from importlib.metadata import version

    ran = run(empty_dir, "--version")
    assert ran.code == 0 and ran.out == f"dormant {version('dormant')}\n"
