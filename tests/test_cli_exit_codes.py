"""The ``dormant`` command's exit codes as a script sees them, and its help as a person does.

A value typed on the command line that cannot be used exits 2 (running it again cannot
help); a deployment that cannot serve the command exits 3 (running it later may). Each case
runs the installed console script as a subprocess, like ``test_cli_errors.py``.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

from dormant.cli import app
from dormant.client import Client
from dormant.errors import ConfigurationError
from dormant.settings import Settings
from tests import test_cli_errors
from tests.test_cli_errors import DORMANT, REFUSED, Ran, assert_one_error_line, run

empty_dir = test_cli_errors.empty_dir
migrated = test_cli_errors.migrated

USAGE = 2


def assert_usage_error(ran: Ran, *fragments: str) -> None:
    """Click's usage error: the usage line, a hint, and one ``Error:`` line; exit 2."""
    assert "Traceback" not in ran.out + ran.err, ran.err
    assert ran.code == USAGE, (ran.code, ran.err)
    errors = [line for line in ran.err.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, ran.err
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert "pw" not in ran.err  # passwords are never printed


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["threads", "--database-url", "notaurl"], "'notaurl' is not a database URL"),
        (["show", "t", "--database-url", "mysql://u:pw@localhost/x"], "unsupported database"),
        (["db", "upgrade", "--database-url", "notaurl"], "is not a database URL"),
        (["threads", "--status", "bogus"], "'bogus' is not a status"),
        (["serve", "--port", "99999"], "'--port'"),
        (["callbacks", "--port", "99999"], "'--port'"),
        (["prune", "--older-than", "soon"], "'soon' is not an age"),
        (["usage", "--since", "soon"], "'--since'"),
        (["launch", "a", "hi", "--priority", "urgent"], "'urgent' is not a priority"),
        (["worker", "--concurrency", "0"], "'--concurrency'"),
        (["worker", "--loglevel", "loud"], "'loud' is not a log level"),
        (["worker", "--queues", ","], "name at least one queue"),
        (["beat", "--loglevel", "loud"], "'loud' is not a log level"),
        (["launch", "a", "hi", "--agents", "no_such_agents"], "no module 'no_such_agents'"),
        (["worker", "--agents", "no_such.agents"], "no module 'no_such.agents'"),
        (["check", "--upgrade", "--agents", "no_such.agents"], "no module 'no_such.agents'"),
    ],
)
def test_a_bad_option_value_is_a_usage_error_with_exit_2_not_3(
    empty_dir: Path, args: list[str], fragment: str
) -> None:
    assert_usage_error(run(empty_dir, *args), fragment)


def test_check_upgrade_imports_the_new_agents_module_from_the_current_directory(
    tmp_path: Path, migrated: str
) -> None:
    """docs/upgrades.md runs ``dormant check --upgrade --agents myapp.agents_next`` in the
    project, like ``dormant worker --agents myapp.agents``: no ``PYTHONPATH`` needed."""
    project = tmp_path / "project"
    (project / "myapp").mkdir(parents=True)
    (project / "myapp" / "__init__.py").write_text("")
    (project / "myapp" / "agents_next.py").write_text(
        "from dormant import Agent\n"
        "from dormant.models import ScriptedModel, reply\n"
        "calc = Agent('calc', model=ScriptedModel(lambda items: reply('ok')))\n"
    )
    args = ["check", "--upgrade", "--agents", "myapp.agents_next"]
    ran = run(project, *args, DORMANT_DATABASE_URL=migrated)
    assert (ran.code, ran.out) == (0, "no problems found in the open threads\n"), ran.err


def test_a_broker_url_with_an_unusable_scheme_is_refused_when_the_settings_are_built() -> None:
    env = {"DORMANT_BROKER_URL": "http://user:pw@mq.example:8080/"}
    for build in (Settings.from_env, Client.from_env):
        with pytest.raises(ConfigurationError) as refused:
            build(env)
        message = str(refused.value)
        assert "DORMANT_BROKER_URL" in message and "pw" not in message
        assert "redis://" in message and "amqp://" in message
    failover = Settings.from_env({"DORMANT_BROKER_URL": "amqp://a//;amqp://b//"})
    assert failover.broker_url == "amqp://a//;amqp://b//"


def _busy_port() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


@pytest.mark.parametrize("command", ["serve", "callbacks"])
def test_serve_and_callbacks_on_a_busy_port_say_so_alike_and_exit_3(
    empty_dir: Path, migrated: str, command: str
) -> None:
    with _busy_port() as holder:
        port = holder.getsockname()[1]
        ran = run(
            empty_dir,
            command,
            "--port",
            str(port),
            DORMANT_DATABASE_URL=migrated,
            DORMANT_SECRET_KEY="k",
        )
    assert_one_error_line(ran, REFUSED, f"cannot listen on 127.0.0.1:{port}", "in use")


def _as_a_plain_user(*args: str) -> tuple[Path, list[str]]:
    """The ``dormant`` command with ``args``, as ``run`` takes it, run without the
    capability that lets root write a file whose mode says read-only."""
    if os.geteuid() != 0:
        return DORMANT, list(args)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("!!! running as root without setpriv: the read-only case is NOT RUN")
    return Path(setpriv), [
        "--bounding-set=-dac_override,-dac_read_search,-fowner",
        str(DORMANT),
        *args,
    ]


def test_a_read_only_sqlite_file_is_named_as_read_only_not_unreachable(
    empty_dir: Path, migrated: str
) -> None:
    path = migrated.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:  # no -wal/-shm left for the read-only run to use
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    os.chmod(path, 0o444)
    program, args = _as_a_plain_user("launch", "a", "hi")
    try:
        ran = run(empty_dir, *args, program=program, DORMANT_DATABASE_URL=migrated)
    finally:
        os.chmod(path, 0o644)
    line = assert_one_error_line(ran, REFUSED, "read-only", repr(path))
    assert "unreachable" not in line


def test_help_shows_no_type_after_a_flag_and_documents_the_exit_codes() -> None:
    runner = CliRunner()
    root = runner.invoke(app, ["--help"])
    assert root.exit_code == 0
    for code in ("0  done", "1  refused", "2  the command line is wrong", "3  the deployment"):
        assert code in root.output
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    paths = [[name] for name in group.commands if name != "db"] + [["db"], ["db", "upgrade"]]
    for path in paths:
        helped = runner.invoke(app, [*path, "--help"])
        assert helped.exit_code == 0, (path, helped.output)
        assert "<bool>" not in helped.output, (path, helped.output)
        assert "--help" in helped.output and "Show this message and exit." in helped.output
