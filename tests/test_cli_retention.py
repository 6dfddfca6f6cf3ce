"""``dormant quarantine``, ``dormant retry THREAD [MESSAGE]`` and ``dormant prune``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dormant.cli import app
from dormant.stores.base import InboxState, ThreadStatus
from dormant.stores.sql.store import SQLStore, upgrade
from tests.test_store_contract import enqueue, new_thread
from tests.test_store_retention import consume

runner = CliRunner()


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for name in [k for k in os.environ if k.startswith("DORMANT_")]:
        monkeypatch.delenv(name)
    database = f"sqlite:///{tmp_path}/dormant.db"
    upgrade(database)
    return database


def test_quarantined_messages_are_listed_and_retry_requeues_one(url: str) -> None:
    store = SQLStore(url)
    t = new_thread(store).id
    bad = enqueue(store, t, "poison", message_id="m-bad")
    enqueue(store, t, "also bad", message_id="m-worse")
    store.quarantine(t, bad.id, "quarantined after 3 failed slices: KeyError: 'x'")
    tree = runner.invoke(app, ["threads", "--database-url", url])
    assert tree.exit_code == 0 and "quarantined: m-bad" in tree.output
    listed = runner.invoke(app, ["quarantine", "--database-url", url])
    assert listed.exit_code == 0, listed.output
    assert "m-bad" in listed.output and "KeyError" in listed.output
    assert "m-worse" not in listed.output

    unknown = runner.invoke(app, ["retry", t, "m-worse", "--database-url", url])
    assert unknown.exit_code == 1 and "no quarantined message 'm-worse'" in unknown.stderr
    retried = runner.invoke(app, ["retry", t, "m-bad", "--database-url", url])
    assert retried.exit_code == 0, retried.output
    assert "message m-bad is queued again" in retried.output
    assert [r.message_id for r in store.inbox(t, InboxState.PENDING)] == ["m-bad", "m-worse"]
    nothing = runner.invoke(app, ["retry", t, "--database-url", url])
    assert nothing.exit_code == 1 and "not stalled, and has no quarantined" in nothing.stderr
    assert runner.invoke(app, ["quarantine", "--database-url", url]).output.strip() == (
        "no quarantined messages"
    )
    store.close()


def test_a_quarantine_reason_in_brackets_is_shown_as_written(url: str) -> None:
    """The table prints errors as text: pydantic's ``[type=missing, ...]`` is not Rich
    markup to strip."""
    store = SQLStore(url)
    t = new_thread(store).id
    bad = enqueue(store, t, "poison", message_id="m-[bad]")
    store.quarantine(t, bad.id, "ValidationError: order_id Field required [type=missing]")
    listed = runner.invoke(app, ["quarantine", "--database-url", url], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert "required [type=missing]" in listed.output and "m-[bad]" in listed.output
    store.close()


def test_quarantine_prints_whole_ids_that_retry_takes_in_an_80_column_terminal(
    url: str,
) -> None:
    """The table cut a thread's and a message's generated ids to ``thr_160b81047f…`` and
    ``msg_425eae6d1e…`` at 80 columns: nothing an operator could give ``dormant retry``."""
    store = SQLStore(url)
    t = new_thread(store).id
    message_id = "msg_425eae6d1e054e2397f276b83df072fc"
    bad = enqueue(store, t, "poison", message_id=message_id)
    store.quarantine(t, bad.id, "quarantined after 3 failed slices: ModelFatal: " + "x" * 120)
    listed = runner.invoke(app, ["quarantine", "--database-url", url], env={"COLUMNS": "80"})
    assert listed.exit_code == 0, listed.output
    assert f"{t} {message_id}" in listed.output
    assert "ModelFatal: " + "x" * 120 in listed.output
    retried = runner.invoke(app, ["retry", t, message_id, "--database-url", url])
    assert retried.exit_code == 0, retried.output
    store.close()


def test_retry_without_a_thread_asks_for_one_and_does_not_say_not_both(url: str) -> None:
    """``dormant retry`` alone said "give a THREAD or --status stalled, not both", as if
    both had been given."""
    neither = runner.invoke(app, ["retry", "--database-url", url])
    assert neither.exit_code == 2
    assert "give a THREAD, or --status stalled" in neither.output
    assert "not both" not in neither.output


def test_prune_counts_in_a_dry_run_then_deletes_in_batches(url: str) -> None:
    store = SQLStore(url)
    gone = new_thread(store).id
    enqueue(store, gone, "bye")
    consume(store, gone, ThreadStatus.CLOSED)
    kept = new_thread(store).id
    enqueue(store, kept, "hello")
    args = ["prune", "--older-than", "0s", "--batch", "1", "--database-url", url]

    dry = runner.invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would delete 1 threads, 1 inbox rows" in dry.stdout
    store.thread(gone)
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    assert "deleted 1 threads, 1 inbox rows" in done.stdout  # as the dry run said
    assert "batch: 1 threads" in done.stderr
    shown = runner.invoke(app, ["show", gone, "--database-url", url])
    assert shown.exit_code == 1 and "never created, or pruned" in shown.stderr
    assert store.thread(kept).status is ThreadStatus.IDLE
    bad_age = runner.invoke(app, ["prune", "--older-than", "a month", "--database-url", url])
    assert bad_age.exit_code != 0 and "not an age" in bad_age.stderr
    store.close()
