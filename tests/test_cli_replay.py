"""``dormant replay`` as a user meets it, in a real process: a batch that has nothing to
replay says so and fails; one that no live worker will run says so at once and shows how
far it got instead of waiting in silence."""

from __future__ import annotations

import json
from pathlib import Path

from dormant import LocalSystem
from tests.test_cli_errors import assert_one_error_line, empty_dir, migrated, run
from tests.test_replay import AGENT, _settings

__all__ = ["empty_dir", "migrated"]  # fixtures


def _record(url: str, *texts: str) -> list[str]:
    with LocalSystem([AGENT], url, settings=_settings()) as system:
        threads = [system.launch("support", text) for text in texts]
        system.run_until_idle()
    return threads


def test_a_replay_of_an_agent_with_nothing_recorded_is_refused(
    empty_dir: Path, migrated: str
) -> None:
    _record(migrated, "order 1")
    ran = run(empty_dir, "replay", "--agent", "billing", "--tag", "exp1",
              DORMANT_DATABASE_URL=migrated)  # fmt: skip
    assert_one_error_line(ran, 1, "agent 'billing' has no thread to replay (--since 7d")


def test_a_replay_no_worker_runs_warns_and_reports_its_progress(
    empty_dir: Path, migrated: str, tmp_path: Path
) -> None:
    sources = _record(migrated, "order 1", "order 2")
    report = tmp_path / "exp1.json"
    ran = run(
        empty_dir,
        *("replay", "--agent", "support", "--tag", "exp1", "--timeout-s", "1"),
        *("--report", str(report)),
        DORMANT_DATABASE_URL=migrated,
    )
    assert ran.code == 0, ran.err
    assert "Traceback" not in ran.err
    assert "warning: no live worker runs agent 'support' (`dormant versions`)" in ran.err
    assert "replays finished" in ran.err and "0/2" in ran.err
    assert "2 replays of support (exp1): 0 same, 2 diverged, 2 unfinished" in ran.out
    found = json.loads(report.read_text())
    assert sorted(r["source_id"] for r in found["runs"]) == sorted(sources)
