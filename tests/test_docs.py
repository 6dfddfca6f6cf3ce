"""The docs name tests as proof: each named test must exist."""

from __future__ import annotations

import contextlib
import io
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
