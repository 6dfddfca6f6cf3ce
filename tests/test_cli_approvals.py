"""``dormant approvals`` without a Celery worker: what the command line itself decides."""

from __future__ import annotations

import getpass
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dormant.cli import app
from dormant.stores.sql.store import upgrade

runner = CliRunner()


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for name in [k for k in os.environ if k.startswith("DORMANT_")]:
        monkeypatch.delenv(name)
    database = f"sqlite:///{tmp_path}/dormant.db"
    upgrade(database)
    monkeypatch.setenv("DORMANT_DATABASE_URL", database)
    return database


@pytest.mark.parametrize("command", [["approve"], ["reject"], ["edit", '{"amount": 1}']])
def test_without_a_login_name_a_decision_asks_for_by(
    url: str, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """``--by`` defaults to the login name; a process whose uid has no name (a container
    run as an arbitrary uid, no ``USER``) got "unexpected KeyError: 'getpwuid(): uid not
    found: 12345'" instead of being told to give ``--by``."""

    def no_name() -> str:
        raise KeyError("getpwuid(): uid not found: 12345")

    monkeypatch.setattr(getpass, "getuser", no_name)
    verb, *rest = command
    ran = runner.invoke(app, ["approvals", verb, "thr_x", "call_x", *rest])
    assert ran.exit_code == 2, ran.output
    assert "no login name" in ran.output and "--by" in ran.output
    assert "unexpected" not in ran.output
