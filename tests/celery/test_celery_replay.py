"""Replays on real workers: each is served its source's recorded tool result in the slice,
so the tool runs only for the sources, and each repeats its source; ``dormant replay``
runs a sampled batch and writes one report."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from conftest import Deployment, wait_until
from typer.testing import CliRunner

from dormant.cli import app
from dormant.messages import AssistantTurn, Item, ToolResult
from dormant.stores.base import ThreadStatus


def _tally_runs(d: Deployment) -> int:
    return int(d.redis.get(d.key("runs", "tally")) or 0)


def _shape(items: list[Item]) -> list[object]:
    """Items without their call ids (each run of the model makes fresh ones)."""
    return [
        (i.text, [(c.name, c.args) for c in i.calls])
        if isinstance(i, AssistantTurn)
        else (i.name, i.content)
        if isinstance(i, ToolResult)
        else i
        for i in items
    ]


def test_a_batch_of_replays_on_workers_runs_no_tool_and_repeats_each_source(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy()
    worker = d.start_worker("w1", concurrency=2)
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    sources = [client.launch("tallier", f"count the stock, please ({n})") for n in range(3)]

    def idle(thread_id: str) -> bool:
        return client.thread(thread_id).status is ThreadStatus.IDLE

    wait_until(
        lambda: all(idle(s) for s in sources) and _tally_runs(d) == 3,
        60,
        "the sources to run their tool",
        check=d.check_alive,
    )
    replays = [client.replay(s, tag="celery-batch") for s in sources]
    wait_until(
        lambda: all(idle(r) and len(client.history(r)) == 4 for r in replays),
        60,
        "the replays to finish",
        check=d.check_alive,
    )
    assert _tally_runs(d) == 3  # served from the record: no tool task ran for a replay
    for source, replay in zip(sources, replays, strict=True):
        assert _shape(client.history(replay)) == _shape(client.history(source))
        assert client.thread(replay).metadata["replay"]["tag"] == "celery-batch"


def test_dormant_replay_runs_a_sampled_batch_on_workers_and_writes_one_report(
    deploy: Callable[..., Deployment], tmp_path: Path
) -> None:
    d = deploy()
    worker = d.start_worker("w1", concurrency=2)
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    since = datetime.now(UTC).isoformat()  # the session's database has other tests' threads
    sources = [client.launch("tallier", f"count the stock, please ({n})") for n in range(3)]
    wait_until(
        lambda: (
            all(client.thread(s).status is ThreadStatus.IDLE for s in sources)
            and _tally_runs(d) == 3
        ),
        60,
        "the sources to run their tool",
        check=d.check_alive,
    )
    report = tmp_path / "exp42.json"
    args = ["replay", "--agent", "tallier", "--since", since, "--sample", "2", "--seed", "7"]
    done = CliRunner().invoke(
        app, [*args, "--tag", "exp42", "--report", str(report), "--timeout-s", "60"], env=d.env
    )
    assert done.exit_code == 0, done.output
    assert "2 replays of tallier (exp42): 2 same, 0 diverged, 0 unfinished" in done.output
    found = json.loads(report.read_text())
    assert found["totals"]["served"] == 2 and found["totals"]["missed"] == 0
    assert {r["source_id"] for r in found["runs"]} < set(sources)
    assert _tally_runs(d) == 3
    assert client.store.usage(agent="tallier")["tallier [replay:exp42]"].completions == 4  # 2 each
