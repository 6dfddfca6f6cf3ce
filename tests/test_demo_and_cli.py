"""The first five minutes: ``dormant demo``, ``dormant --help`` and the inspection commands."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import dormant
import dormant.models
from dormant import LocalSystem
from dormant.cli import app
from dormant.demo import run_demo
from tests.test_cli_errors import empty_dir, migrated, run
from tests.test_replay import AGENT, _settings

runner = CliRunner()

__all__ = ["empty_dir", "migrated"]  # fixtures


def test_the_demo_runs_the_whole_scenario_on_sqlite(tmp_path: Path) -> None:
    out = io.StringIO()
    slices = run_demo(Console(file=out, width=200), database_path=tmp_path / "demo.db")
    text = out.getvalue()
    assert slices >= 5
    assert len(re.findall(r"^\s+refused ", text, re.MULTILINE)) == 4
    assert "shown as receive_event__injected" in text
    assert "↳ event thread" in text
    assert re.search(r"stored size of the idle agent: [\d,]+ bytes", text)
    assert "thread thr_demo is idle" in text


def test_the_demo_keeps_its_database_and_the_commands_it_prints_inspect_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("DORMANT_")]:
        monkeypatch.delenv(name)
    for _run in range(2):  # a second run replaces the first one's database cleanly
        out = io.StringIO()
        run_demo(Console(file=out, width=60))
    assert (tmp_path / "dormant-demo.db").exists()
    text = out.getvalue()
    assert "(start-up and database set-up not counted)" in " ".join(text.split())
    commands = [line.strip() for line in text.splitlines() if "--database-url" in line]
    asked = [c.split(" --database-url ")[0].split(" dormant ")[-1] for c in commands]
    assert asked == ["threads", "show thr_demo", "show thr_demo --full"]
    outputs = []
    for command in commands:  # each in a new process, exactly as printed
        done = subprocess.run(shlex.split(command), capture_output=True, text=True, check=False)
        assert done.returncode == 0, (command, done.stderr)
        outputs.append(done.stdout)
    threads, shown, full = outputs
    assert threads.count("thr_demo") == 1 and threads.count("[event]") == 1
    assert "Build main, and tell me when a PR comes in." in shown
    assert "Build main, and tell me when a PR comes in." in full


def test_help_lists_every_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("demo", "db", "threads", "show", "retry", "--version", "--debug"):
        assert command in result.output


def test_threads_and_show_read_a_database(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    run_demo(Console(file=io.StringIO()), database_path=db)
    url = f"sqlite:///{db}"
    tree = runner.invoke(app, ["threads", "--database-url", url])
    assert tree.exit_code == 0, tree.output
    assert "thr_demo" in tree.output and "[event]" in tree.output
    shown = runner.invoke(app, ["show", "thr_demo", "--database-url", url])
    assert shown.exit_code == 0, shown.output
    assert "Build main, and tell me when a PR comes in." in shown.output


def test_threads_and_show_print_json_for_scripts(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    run_demo(Console(file=io.StringIO()), database_path=db)
    url = f"sqlite:///{db}"

    listed = runner.invoke(app, ["threads", "--json", "--database-url", url])
    assert listed.exit_code == 0, listed.output
    records = json.loads(listed.stdout)
    demo = records[0]
    assert demo["id"] == "thr_demo" and demo["parent_id"] is None
    assert demo["status"] == "idle" and demo["agent"] and demo["inbox_pending"] == 0
    children = [r for r in records if r["parent_id"] == "thr_demo"]
    assert [c["role"] for c in children] == ["event"]

    shown = runner.invoke(app, ["show", "thr_demo", "--json", "--database-url", url])
    assert shown.exit_code == 0, shown.output
    timeline = json.loads(shown.stdout)
    assert timeline["thread"]["id"] == "thr_demo"
    first = timeline["items"][0]
    assert first["seq"] == 1 and first["inherited"] is False
    assert first["item"]["kind"] == "user"
    assert "Build main, and tell me when a PR comes in." in first["item"]["text"]
    kinds = {i["item"]["kind"] for i in timeline["items"]}
    assert {"user", "assistant", "tool_result"} <= kinds


def test_bad_cli_input_gets_a_clear_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/empty.db"
    assert runner.invoke(app, ["db", "upgrade", "--database-url", url]).exit_code == 0
    missing = runner.invoke(app, ["show", "thr_nope", "--database-url", url])
    assert missing.exit_code == 1
    assert missing.stderr == "error: unknown thread 'thr_nope' (never created, or pruned)\n"
    status = runner.invoke(app, ["threads", "--status", "sleepy", "--database-url", url])
    assert status.exit_code == 2 and "choose from idle" in status.output


def test_the_public_names_are_exactly_these() -> None:
    assert set(dormant.__all__) >= {"Agent", "tool", "ToolContext", "LocalSystem", "Settings"}
    assert set(dormant.models.__all__) >= {
        "ScriptedModel",
        "SimulatedModel",
        "OpenAIModel",
        "AnthropicModel",
    }
    for module in (dormant, dormant.models):
        for name in module.__all__:
            assert getattr(module, name) is not None


def test_the_family_example_shows_two_children_and_an_event_thread(tmp_path: Path) -> None:
    import runpy

    db = tmp_path / "family.db"
    example = runpy.run_path(str(Path(__file__).parent.parent / "examples" / "family.py"))
    example["main"](str(db))
    tree = runner.invoke(app, ["threads", "--database-url", f"sqlite:///{db}"])
    assert tree.exit_code == 0, tree.output
    assert tree.output.count("[child]") == 2 and tree.output.count("[event]") == 1
    assert "subscribed to spawn_thread" not in tree.output  # inherited calls are the parent's
    shown = runner.invoke(app, ["show", "thr_family", "--database-url", f"sqlite:///{db}"])
    assert "Report from child thread" in shown.output and "INC-7" in shown.output


def test_check_passes_on_the_demo_database_and_fails_naming_a_stranded_message(
    tmp_path: Path,
) -> None:
    from dormant.messages import UserMessage
    from dormant.stores.sql.store import SQLStore

    db = tmp_path / "demo.db"
    run_demo(Console(file=io.StringIO()), database_path=db)
    url = f"sqlite:///{db}"
    sound = runner.invoke(app, ["check", "--grace-s", "0", "--database-url", url])
    assert (sound.exit_code, sound.output.strip()) == (0, "no problems found")
    store = SQLStore(url)
    store.enqueue("thr_demo", "stranded", UserMessage(text="anyone?"), 8)
    store.close()
    broken = runner.invoke(app, ["check", "--grace-s", "0", "--json", "--database-url", url])
    assert broken.exit_code == 1
    [problem] = json.loads(broken.output)
    assert (
        problem["thread_id"] == "thr_demo" and "(stranded) was never applied" in problem["detail"]
    )


def test_threads_piped_prints_a_thread_a_line_however_long(
    empty_dir: Path, migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read by ``grep`` or a script (stdout not a terminal), a line is not wrapped at 80."""
    monkeypatch.delenv("COLUMNS", raising=False)  # a width given is a width kept
    long_id = "thr_" + "x" * 90
    with LocalSystem([AGENT], migrated, settings=_settings()) as system:
        system.launch("support", "order 1", thread_id=long_id)
        system.run_until_idle()
    ran = run(empty_dir, "threads", DORMANT_DATABASE_URL=migrated)
    assert ran.code == 0, ran.err
    line = next(line for line in ran.out.splitlines() if long_id in line)
    assert "support" in line and "idle" in line, ran.out
