"""The docs name tests as proof: each named test must exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
