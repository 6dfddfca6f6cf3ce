"""``dormant usage``, ``dormant show`` and ``dormant raise-budget`` on a SQLite file."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dormant import Agent, Budget
from dormant.cli import app
from dormant.ops.usage import parse_since
from dormant.runtime.slice import Failed
from dormant.stores.base import ThreadStatus
from dormant.stores.sql.store import SQLStore, upgrade
from tests.harness import Harness
from tests.test_budgets import loop_agent, run_until_stopped

runner = CliRunner()


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for name in [k for k in os.environ if k.startswith("DORMANT_")]:
        monkeypatch.delenv(name)
    database = f"sqlite:///{tmp_path}/dormant.db"
    upgrade(database)
    return database


def _stopped_loop(url: str) -> tuple[SQLStore, Harness, str]:
    store = SQLStore(url)
    h = Harness(loop_agent(Budget(max_completions_per_message=None, max_tokens=300)), store=store)
    t = h.launch("looper", "go")
    run_until_stopped(h, t)
    return store, h, t


def test_usage_prints_a_table_per_agent_and_filters_by_agent_and_time(url: str) -> None:
    store, _h, _t = _stopped_loop(url)
    quiet = Harness(Agent("quiet", model=loop_agent().model), store=store)
    q = quiet.launch("quiet", "hi", budget=Budget(max_completions_per_message=1))
    stopped = quiet.step(q)  # its call to a tool it lacks would need a second completion
    assert isinstance(stopped, Failed) and stopped.stalled
    shown = runner.invoke(app, ["usage", "--database-url", url])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    looper = next(line for line in lines if "looper" in line)
    assert "330" not in looper  # tokens are shown in and out, not summed
    assert [cell.strip() for cell in looper.split("│")[1:7]] == [
        "looper",
        "3",
        "300",
        "30",
        "0",
        "0.000168",  # 300 * 0.40 / 1e6 + 30 * 1.60 / 1e6
    ]
    assert any("quiet" in line for line in lines)
    assert any("total" in line for line in lines)

    only = runner.invoke(app, ["usage", "--agent", "quiet", "--json", "--database-url", url])
    assert only.exit_code == 0, only.output
    assert list(json.loads(only.output)) == ["quiet"]
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    empty = runner.invoke(app, ["usage", "--since", later, "--database-url", url])
    assert empty.exit_code == 0 and "no usage recorded since" in empty.output
    recent = runner.invoke(app, ["usage", "--since", "1h", "--json", "--database-url", url])
    assert json.loads(recent.output)["looper"]["completions"] == 3
    bad = runner.invoke(app, ["usage", "--since", "yesterday", "--database-url", url])
    assert bad.exit_code != 0 and "neither an age" in bad.stderr
    store.close()


def test_show_prints_usage_and_the_stop_and_raise_budget_resumes(url: str) -> None:
    store, h, t = _stopped_loop(url)
    shown = runner.invoke(app, ["show", t, "--database-url", url])
    assert shown.exit_code == 0, shown.output
    assert "stalled" in shown.output
    assert "budget: max_tokens 330/300" in shown.output
    assert "3 completions, 300 tokens in, 30 out" in shown.output
    assert "tree   330 tokens" in shown.output
    record = json.loads(runner.invoke(app, ["show", t, "--json", "--database-url", url]).output)
    assert record["thread"]["usage"]["completions"] == 3
    assert record["thread"]["tree_tokens"] == 330
    listed = runner.invoke(app, ["threads", "--database-url", url])
    assert "budget: max_tokens 330/300" in listed.output

    raised = runner.invoke(app, ["raise-budget", t, "--max-tokens", "1000", "--database-url", url])
    assert raised.exit_code == 0, raised.output
    assert f"thread {t} resumed" in raised.output
    assert store.thread(t).status is ThreadStatus.WAITING  # on the ping it was stopped at
    assert store.threads_to_wake() == [t]  # the sweeper takes it from here
    run_until_stopped(h, t)
    assert store.thread(t).last_error.startswith("budget: max_tokens 1100/1000")
    none = runner.invoke(app, ["raise-budget", t, "--database-url", url])
    assert none.exit_code == 2
    store.close()


def test_a_raised_limit_on_the_agents_budget_says_the_others_are_the_agents(url: str) -> None:
    """``raise-budget --max-tokens`` on a thread under its agent's budget stores only
    ``max_tokens``; ``show`` then said "budget max_tokens=400000" and ``raise-budget``
    "{'max_tokens': 400000}", while the agent's per-message cap still stopped the thread.
    Both now say the limits not raised are the agent's."""
    store = SQLStore(url)
    h = Harness(loop_agent(Budget(max_completions_per_message=3)), store=store)
    t = h.launch("looper", "go")
    run_until_stopped(h, t)
    raise_tokens = ["raise-budget", t, "--max-tokens", "400000", "--database-url", url]
    raised = runner.invoke(app, raise_tokens)
    assert raised.exit_code == 0, raised.output
    said = f"budget of {t}: max_tokens=400000; the agent's max_completions_per_message, max_cost"
    assert said in raised.output
    # pytest-xdist's workers have COLUMNS=80, and a width given is a width kept.
    shown = runner.invoke(app, ["show", t, "--database-url", url], env={"COLUMNS": "300"})
    assert "budget max_tokens=400000; the agent's max_completions_per_message, max_cost" in (
        shown.output
    )
    store.close()


def test_since_takes_an_age_or_an_iso_time() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert parse_since("90m", now) == now - timedelta(minutes=90)
    assert parse_since("2026-12-01T10:00:00") == datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
