"""The docs name tests as proof: each named test must exist."""

from __future__ import annotations

import contextlib
import io
import json
import re
import sqlite3
from pathlib import Path

import pytest

from dormant.stores.sql.store import upgrade

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))


def defined_tests() -> set[str]:
    pattern = re.compile(r"^\s*(?:async\s+)?def (test_\w+)", re.MULTILINE)
    return {
        name
        for path in (ROOT / "tests").rglob("*.py")
        for name in pattern.findall(path.read_text())
    }


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_test_a_doc_names_as_proof_exists(doc: Path) -> None:
    named = set(re.findall(r"`(test_\w+)`", doc.read_text()))
    assert named - defined_tests() == set(), f"{doc.name} names tests that do not exist"


def test_the_guarantees_page_names_tests() -> None:
    assert len(re.findall(r"`(test_\w+)`", (ROOT / "docs" / "guarantees.md").read_text())) > 10


def test_the_tools_page_schedule_snippet_shows_the_message_to_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/tools.md: a plain tool's ``ctx.schedule`` reaches the model when due (run in a
    folder of its own: its ``sqlite:///dormant.db`` must not be the checkout's)."""
    monkeypatch.chdir(tmp_path)
    doc = ROOT / "docs" / "tools.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), re.DOTALL)
    snippet = next(b for b in blocks if "ctx.schedule" in b)
    printed = re.search(
        r"and the model's answer to it:\n\n```\n(.*?)```", doc.read_text(), re.DOTALL
    )
    assert printed is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, str(doc), "exec"), {})
    assert out.getvalue() == printed[1]


def test_the_approvals_page_snippet_prints_what_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/approvals.md: the held refund, edited, runs with the edited amount."""
    monkeypatch.chdir(tmp_path)
    doc = ROOT / "docs" / "approvals.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), re.DOTALL)
    snippet = next(b for b in blocks if "LocalSystem([clerk]" in b)
    printed = re.search(r"\n\nprints\n\n```\n(.*?)```", doc.read_text(), re.DOTALL)
    assert printed is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, str(doc), "exec"), {})
    assert out.getvalue() == printed[1]


def test_the_django_page_names_the_alembic_version_table_its_prefix_gives(
    tmp_path: Path,
) -> None:
    """With the page's ``TABLE_PREFIX``, ``migrate`` versions dormant's schema in the table
    the page names: the one ``dormant db upgrade`` really creates with that prefix."""
    doc = (ROOT / "docs" / "django.md").read_text()
    found = re.search(r'"TABLE_PREFIX": "(\w+)"', doc)
    assert found is not None
    prefix = found[1]
    upgrade(f"sqlite:///{tmp_path / 'django.db'}", table_prefix=prefix)
    with sqlite3.connect(tmp_path / "django.db") as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    (version_table,) = [t for t in tables if t.endswith("alembic_version")]
    assert version_table.startswith(prefix)
    assert f"`{version_table}`" in doc


def _python_blocks(doc: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", doc.read_text(), re.DOTALL)


def test_the_approvals_page_command_lines_use_options_the_commands_have() -> None:
    """docs/approvals.md's ``dormant approvals`` synopsis: every option is one the command
    takes, and the edit's arguments are a whole set the page's refund tool accepts (an
    edit replaces the model's arguments, so one field alone is refused)."""
    from typer.testing import CliRunner

    from dormant.cli import app

    doc = ROOT / "docs" / "approvals.md"
    lines = re.findall(r"^dormant approvals (\w+) (.*)$", doc.read_text(), re.MULTILINE)
    assert {command for command, _ in lines} == {"list", "approve", "reject", "edit"}
    for command, rest in lines:
        shown = CliRunner().invoke(app, ["approvals", command, "--help"])
        assert shown.exit_code == 0, shown.output
        for option in re.findall(r"--[a-z-]+", rest):
            assert option in shown.output, f"dormant approvals {command} has no {option}"
    edit = next(rest for command, rest in lines if command == "edit")
    found = re.search(r"'(\{.*?\})'", edit)
    assert found is not None
    namespace: dict[str, object] = {}
    snippet = next(b for b in _python_blocks(doc) if "LocalSystem([clerk]" in b)
    exec(compile(snippet.split("\nclerk = ")[0], str(doc), "exec"), namespace)
    refund = namespace["refund"]
    assert refund.error_for(json.loads(found[1])) is None  # type: ignore[attr-defined]


def test_the_upgrades_page_upgrade_args_maps_old_calls_and_leaves_new_ones() -> None:
    """docs/upgrades.md's ``from_lookup``: a call stored before the rename (``id``) runs
    on the new signature, a current call passes through unchanged."""
    doc = ROOT / "docs" / "upgrades.md"
    snippet = next(b for b in _python_blocks(doc) if "upgrade_args=from_lookup" in b)
    namespace: dict[str, object] = {"tool": __import__("dormant").tool}
    exec(compile(snippet, str(doc), "exec"), namespace)
    find_order = namespace["find_order"]
    upgrade = find_order.upgrade_args  # type: ignore[attr-defined]
    assert find_order.aliases == ("lookup",)  # type: ignore[attr-defined]
    assert find_order.error_for(upgrade({"id": 7})) is None  # type: ignore[attr-defined]
    assert upgrade({"order_id": 7, "include_lines": True}) == {"order_id": 7, "include_lines": True}
    assert find_order.error_for({"id": 7}) is not None  # type: ignore[attr-defined]


def test_the_monitoring_page_quotes_both_no_agents_refusals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/monitoring.md, "Without agents": ``dormant worker`` says the agents are missing
    (exit 3) in the line the page prints; the Celery worker's line (``worker.py``) too."""
    from typer.testing import CliRunner

    from dormant.agents import NO_AGENTS
    from dormant.cli import app

    monkeypatch.chdir(tmp_path)
    for name in ("DORMANT_AGENTS", "DORMANT_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DORMANT_SECRET_KEY", "dev-key")
    upgrade("sqlite:///dormant.db")
    ran = CliRunner().invoke(app, ["worker"])
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    assert ran.exit_code == 3, ran.output
    assert f"\n{ran.output.strip()}\n```" in doc
    assert f"\nerror: a worker cannot start: {NO_AGENTS}\n```" in doc


def test_the_readme_command_list_names_commands_and_options_that_exist() -> None:
    """README.md, "The command line": each line's command answers ``--help`` and has every
    option the line names."""
    from typer.testing import CliRunner

    from dormant.cli import app

    readme = (ROOT / "README.md").read_text()
    block = readme.split("## The command line", 1)[1].split("```")[1]
    for line in block.strip().splitlines():
        words = line.split("  ", 1)[0].split()[1:]
        if words[0].startswith("--"):
            continue  # dormant --version
        path = [w for w in words[:2] if re.fullmatch(r"[a-z][a-z-]*", w)][
            : 2 if "|" not in line else 1
        ]
        shown = CliRunner().invoke(app, [*path, "--help"])
        assert shown.exit_code == 0, (line, shown.output)
        for option in re.findall(r"--[a-z][a-z-]*", line):
            assert option in shown.output, f"dormant {' '.join(path)} has no {option}"
