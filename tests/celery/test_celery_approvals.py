"""On real Celery workers: a call held for approval holds no worker while it waits (the
workers may all be gone), and an approval decided days later runs the tool with the
approved arguments exactly once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from conftest import Deployment, wait_until

from dormant.errors import AlreadyDecided
from dormant.messages import AssistantTurn, ToolResult
from dormant.stores.base import ThreadStatus


def test_an_approval_decided_days_later_runs_the_approved_call_once(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_AGENTS="approval_agents")
    first = d.start_worker("w1")
    d.start_beat()
    d.wait_ready(first)
    client = d.client()
    thread_id = client.launch("payer", "pay acme")

    def held() -> bool:
        answered = [i for i in client.history(thread_id) if isinstance(i, ToolResult)]
        return len(client.pending_approvals(root_id=thread_id)) == 1 and len(answered) == 1

    wait_until(held, 60, "the payment to be held and the balance answered", check=d.check_alive)
    [approval] = client.pending_approvals(root_id=thread_id)
    assert approval.args == {"account": "acme", "amount": 250.0}
    assert approval.prompt == "Pay 250.0 to acme?"

    # Days pass: no worker runs at all meanwhile; the thread is only stored rows.
    d.expected_deaths.add("w1")
    first.kill()
    later = datetime.now(UTC) + timedelta(days=3)
    assert [p.call_id for p in client.pending_approvals(older_than_s=2 * 86_400, now=later)] == [
        "c_pay"
    ]
    assert client.pending_approvals(older_than_s=4 * 86_400, now=later) == []
    assert client.thread(thread_id).status is ThreadStatus.WAITING
    assert d.redis.llen(d.key("paid")) == 0

    second = d.start_worker("w2")
    d.wait_ready(second)
    client.approve(thread_id, "c_pay", by="alice", digest=approval.digest, channel="test")
    with pytest.raises(AlreadyDecided):
        client.approve(thread_id, "c_pay", by="bob", digest=approval.digest)
    wait_until(
        lambda: client.history(thread_id)[-1:] == [AssistantTurn(text="done after 2 results")],
        60,
        "the approved payment to run and the model to answer",
        check=d.check_alive,
        poll_s=0.2,
    )
    paid = [json.loads(p) for p in d.redis.lrange(d.key("paid"), 0, -1)]
    assert paid == [{"account": "acme", "amount": 250.0}]
    # Absence shows only over time: for a few sweeps more, nothing runs again.
    watch_until = time.monotonic() + 3
    while time.monotonic() < watch_until:
        d.check_alive()
        assert d.redis.llen(d.key("paid")) == 1
        time.sleep(0.5)
    assert client.pending_approvals(root_id=thread_id) == []


def test_the_command_line_lists_and_decides_approvals(
    deploy: Callable[..., Deployment],
) -> None:
    from typer.testing import CliRunner

    from dormant.cli import app

    runner = CliRunner()
    d = deploy(DORMANT_AGENTS="approval_agents")
    worker = d.start_worker("w1", concurrency=2)
    d.wait_ready(worker)
    client = d.client()
    thread_id = client.launch("payer", "pay acme")
    wait_until(
        lambda: len(client.pending_approvals(root_id=thread_id)) == 1,
        60,
        "the payment to be held",
        check=d.check_alive,
    )
    listed = runner.invoke(app, ["approvals", "list", "--json"], env=d.env)
    assert listed.exit_code == 0, listed.output
    [shown] = json.loads(listed.output)
    assert (shown["thread_id"], shown["call_id"], shown["tool"]) == (thread_id, "c_pay", "pay")
    text = runner.invoke(app, ["approvals", "list", "--root", thread_id], env=d.env)
    assert "Pay 250.0 to acme?" in text.output and shown["digest"] in text.output

    def decide(*args: str) -> tuple[int, str]:
        done = runner.invoke(app, ["approvals", *args], env=d.env)
        return done.exit_code, done.output

    code, out = decide("approve", thread_id, "c_pay", "--digest", "f" * 32, "--by", "ops")
    assert code == 1 and "does not match the stored arguments" in out
    code, out = decide("edit", thread_id, "c_pay", '{"account": "acme", "amount": "x"}')
    assert code == 1 and "amount" in out
    code, out = decide("edit", thread_id, "c_pay", "[1]")
    assert code == 2 and "JSON object" in out
    new_args = '{"account": "acme", "amount": 90.0}'
    code, out = decide("edit", thread_id, "c_pay", new_args, "--digest", shown["digest"])
    assert code == 0, out
    code, out = decide("reject", thread_id, "c_pay", "--by", "late")
    assert code == 1 and "already decided" in out
    wait_until(
        lambda: client.history(thread_id)[-1:] == [AssistantTurn(text="done after 2 results")],
        60,
        "the edited payment to run",
        check=d.check_alive,
        poll_s=0.2,
    )
    paid = [json.loads(p) for p in d.redis.lrange(d.key("paid"), 0, -1)]
    assert paid == [{"account": "acme", "amount": 90.0}]
    code, out = decide("list")
    assert code == 0 and "no calls await approval" in out


def test_a_worker_killed_between_the_decision_and_the_dispatch_pays_once(
    deploy: Callable[..., Deployment],
) -> None:
    import signal

    d = deploy(
        DORMANT_AGENTS="approval_agents",
        DORMANT_LEASE_TTL_S="2",
        DORMANT_VISIBILITY_TIMEOUT_S="4",
        DORMANT_OUTBOX_GRACE_S="1",
    )
    first = d.start_worker("w1")
    d.start_beat()
    d.wait_ready(first)
    client = d.client()
    thread_id = client.launch("payer", "pay acme")

    def held() -> bool:  # and the balance answered: the decision's is the next slice
        answered = [i for i in client.history(thread_id) if isinstance(i, ToolResult)]
        return len(client.pending_approvals(root_id=thread_id)) == 1 and len(answered) == 1

    wait_until(held, 60, "the payment to be held", check=d.check_alive)
    d.expected_deaths |= {"w1", "doomed"}
    first.kill()
    # The next slice (the decision's) commits the approval, then its worker dies before
    # it dispatches the payment's outbox row.
    doomed = d.start_worker("doomed", env={"DORMANT_CRASH_POINTS": "after_commit"})
    d.wait_ready(doomed)
    client.approve(thread_id, "c_pay", by="alice")
    wait_until(lambda: not doomed.alive(), 60, "the worker to die after the commit")
    assert doomed.popen.returncode == -signal.SIGKILL, doomed.log()
    survivor = d.start_worker("survivor")
    d.wait_ready(survivor)
    wait_until(
        lambda: client.history(thread_id)[-1:] == [AssistantTurn(text="done after 2 results")],
        60,
        "the sweeper to dispatch the approved payment",
        check=d.check_alive,
        poll_s=0.2,
    )
    assert d.redis.llen(d.key("paid")) == 1
    assert d.unran(client, thread_id) == []
    results = [i for i in client.history(thread_id) if isinstance(i, ToolResult)]
    assert sorted(r.call_id for r in results) == ["c_balance", "c_pay"]
