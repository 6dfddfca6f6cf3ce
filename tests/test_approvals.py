"""Human approval of tool calls, through the public client API, on memory, SQLite and
PostgreSQL: the call is held (not dispatched), decided once, and runs with exactly the
arguments a person saw or edited; every refusal leaves the call with exactly one result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dormant import Agent, Approval, tool
from dormant.errors import (
    AlreadyDecided,
    DecisionNotAllowed,
    DigestMismatch,
    InvalidEdit,
    NotAwaitingApproval,
    UnknownCall,
)
from dormant.messages import (
    ApprovalDecision,
    ApprovalRequest,
    Item,
    StatusChanged,
    ToolResult,
    UserText,
)
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.models.wire import flatten
from dormant.runtime.slice import Idle, Waiting
from dormant.stores.base import CallState, Store
from tests.harness import Harness, results

RAN: list[tuple[str, dict[str, Any]]] = []


@tool(approval=Approval(prompt="Refund {amount} to {order_id}?", timeout_s=3600))
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    RAN.append(("refund", {"order_id": order_id, "amount": amount}))
    return f"refunded {amount} to {order_id}"


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    RAN.append(("lookup", {"order_id": order_id}))
    return f"order {order_id}: paid"


@tool(approval=Approval(when=lambda args, _ctx: args["amount"] > 100, decisions=("approve",)))
def small_refund(order_id: str, amount: float) -> str:
    """A refund needing approval only above 100."""
    RAN.append(("small_refund", {"order_id": order_id, "amount": amount}))
    return "ok"


@tool
def delete_repo(name: str) -> str:
    """Delete a repository (someone else's tool: the agent's pattern guards it)."""
    RAN.append(("delete_repo", {"name": name}))
    return "deleted"


@pytest.fixture(autouse=True)
def _clear_runs() -> None:
    RAN.clear()


def _script(first: Completion) -> ScriptedModel:
    """The first user text gets ``first``'s calls, later text a plain reply; once every
    call has its result, a final reply says how many results the model saw."""

    def script(items: Sequence[Item]) -> Completion:
        if isinstance(items[-1], UserText):
            return first if sum(isinstance(i, UserText) for i in items) == 1 else reply("ok")
        return reply(f"done after {len(results(items))} results")

    return ScriptedModel(script)


def _harness(store: Store, first: Completion, **agent: Any) -> tuple[Harness, ScriptedModel]:
    model = _script(first)
    tools = [refund, lookup, small_refund, delete_repo]
    return Harness(Agent("clerk", model=model, tools=tools, **agent), store=store), model


def _refund_and_lookup() -> Completion:
    return reply(
        "",
        call("refund", "c_refund", order_id="o1", amount=250.0),
        call("lookup", "c_lookup", order_id="o1"),
    )


def test_a_call_needing_approval_is_held_while_its_sibling_runs(store: Store) -> None:
    h, model = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    outcome = h.step(t)
    assert isinstance(outcome, Waiting)
    assert [row.call_id for row in h.outbox] == ["c_lookup"]  # refund not dispatched
    h.run_tools()
    assert isinstance(h.step(t), Waiting)  # lookup answered; the refund still waits
    assert RAN == [("lookup", {"order_id": "o1"})]
    assert len(model.requests) == 1
    statuses = [e for e in h.events(t) if isinstance(e, StatusChanged)]
    assert any("awaiting approval of refund (c_refund)" in e.detail for e in statuses)
    [held] = h.pending_approvals()
    assert (held.thread_id, held.call_id, held.tool) == (t, "c_refund", "refund")
    assert held.args == {"order_id": "o1", "amount": 250.0}
    assert held.prompt == "Refund 250.0 to o1?"
    assert h.agents is not None
    assert held.code_version == h.agents["clerk"].fingerprint  # the version that proposed it
    assert held.expires_at is not None
    request = [i for i in h.history(t) if isinstance(i, ApprovalRequest)]
    assert [r.digest for r in request] == [held.digest]


def test_approve_runs_the_stored_arguments_once_then_the_model_once(store: Store) -> None:
    h, model = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    [held] = h.pending_approvals()
    h.approve(t, held.call_id, by="alice", digest=held.digest, reason="looks right")
    assert h.pending_approvals() == []
    assert isinstance(h.settle(t), Idle)
    assert RAN.count(("refund", {"order_id": "o1", "amount": 250.0})) == 1
    assert len(model.requests) == 2  # the turn's calls, then one completion after both
    assert model.requests[-1].items[-1] == results(h.history(t))[-1]
    decisions = [i for i in h.history(t) if isinstance(i, ApprovalDecision)]
    assert [(d.decision, d.by, d.reason, d.digest) for d in decisions] == [
        ("approve", "alice", "looks right", held.digest)
    ]
    assert h.store.call(t, "c_refund").state is CallState.ANSWERED


def test_reject_answers_the_call_with_who_and_why_and_the_tool_never_runs(store: Store) -> None:
    h, model = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    h.reject(t, "c_refund", by="bob", reason="duplicate order")
    assert isinstance(h.settle(t), Idle)
    assert [name for name, _ in RAN] == ["lookup"]
    [rejected] = [r for r in results(h.history(t)) if r.call_id == "c_refund"]
    assert rejected.is_error
    assert "rejected by bob: duplicate order" in rejected.content
    assert len(model.requests) == 2


def test_edit_runs_the_edited_arguments_and_the_result_says_so(store: Store) -> None:
    h, _ = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    [held] = h.pending_approvals()
    h.edit(t, "c_refund", {"order_id": "o1", "amount": 99.5}, by="carol", digest=held.digest)
    h.settle(t)
    assert ("refund", {"order_id": "o1", "amount": 99.5}) in RAN
    assert not any(args.get("amount") == 250.0 for _, args in RAN)
    [result] = [r for r in results(h.history(t)) if r.call_id == "c_refund"]
    assert result.content.startswith("[arguments changed by carol")
    assert result.content.endswith("refunded 99.5 to o1")


def test_an_edit_failing_the_schema_is_refused_with_the_reason(store: Store) -> None:
    h, _ = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    with pytest.raises(InvalidEdit, match="amount"):
        h.edit(t, "c_refund", {"order_id": "o1", "amount": "lots"}, by="carol")
    assert len(h.pending_approvals()) == 1  # still open: a valid decision may follow
    h.approve(t, "c_refund", by="carol")
    h.settle(t)
    assert len([r for r in results(h.history(t)) if r.call_id == "c_refund"]) == 1


def test_the_first_decision_wins_and_a_later_one_is_already_decided(store: Store) -> None:
    h, _ = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    h.approve(t, "c_refund", by="alice")
    with pytest.raises(AlreadyDecided, match="approve by alice"):
        h.reject(t, "c_refund", by="bob")
    h.settle(t)
    with pytest.raises(AlreadyDecided):
        h.approve(t, "c_refund", by="alice")  # after it ran, too
    assert [name for name, _ in RAN].count("refund") == 1
    assert len([r for r in results(h.history(t)) if r.call_id == "c_refund"]) == 1


def test_a_stale_digest_is_refused(store: Store) -> None:
    h, _ = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    with pytest.raises(DigestMismatch):
        h.approve(t, "c_refund", by="alice", digest="0" * 32)
    assert not any(name == "refund" for name, _ in RAN)
    h.reject(t, "c_refund", by="alice")
    h.settle(t)
    assert len([r for r in results(h.history(t)) if r.call_id == "c_refund"]) == 1


def test_unknown_calls_and_calls_not_awaiting_approval_are_refused(store: Store) -> None:
    h, _ = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    with pytest.raises(UnknownCall):
        h.approve(t, "c_nope", by="alice")
    with pytest.raises(NotAwaitingApproval):
        h.approve(t, "c_lookup", by="alice")
    h.approve(t, "c_refund", by="alice")
    h.settle(t)
    for call_id in ("c_refund", "c_lookup"):
        assert len([r for r in results(h.history(t)) if r.call_id == call_id]) == 1


def test_the_policy_limits_decisions_and_its_predicate_lets_small_calls_run(
    store: Store,
) -> None:
    first = reply(
        "",
        call("small_refund", "c_small", order_id="o1", amount=5.0),
        call("small_refund", "c_big", order_id="o2", amount=500.0),
    )
    h, _ = _harness(store, first)
    t = h.launch("clerk", "refunds")
    h.settle(t)
    assert [name for name, _ in RAN] == ["small_refund"]  # the 5.0 one ran at once
    assert [p.call_id for p in h.pending_approvals()] == ["c_big"]
    with pytest.raises(DecisionNotAllowed):
        h.reject(t, "c_big", by="bob")
    h.approve(t, "c_big", by="bob")
    h.settle(t)
    assert len(RAN) == 2


def test_an_agent_pattern_holds_tools_that_are_not_its_own(store: Store) -> None:
    first = reply("", call("delete_repo", "c_del", name="prod"))
    h, _ = _harness(store, first, approval={"delete_*": True})
    t = h.launch("clerk", "clean up")
    h.settle(t)
    assert RAN == []
    assert [p.tool for p in h.pending_approvals(agent="clerk")] == ["delete_repo"]


def test_a_timeout_fires_once_days_later_and_decides_on_timeout(store: Store) -> None:
    h, model = _harness(store, _refund_and_lookup())
    start = datetime.now(UTC)
    h.deps = replace(h.deps, clock=lambda: start)
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    assert h.store.fire_due_timers(start + timedelta(minutes=59)) == []
    later = start + timedelta(days=3)
    fired = h.store.fire_due_timers(later)
    assert [row.message_id for row in fired] == ["approval:c_refund"]
    assert h.store.fire_due_timers(later + timedelta(days=1)) == []  # once
    h.settle(t)
    [result] = [r for r in results(h.history(t)) if r.call_id == "c_refund"]
    assert result.is_error and "not approved in time" in result.content
    with pytest.raises(AlreadyDecided):
        h.approve(t, "c_refund", by="alice")
    assert not any(name == "refund" for name, _ in RAN)
    assert len(model.requests) == 2


def test_a_decision_deletes_the_timeout_so_it_never_fires(store: Store) -> None:
    h, _ = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    h.approve(t, "c_refund", by="alice")
    h.settle(t)
    assert h.store.fire_due_timers(datetime.now(UTC) + timedelta(days=30)) == []
    assert [r.call_id for r in results(h.history(t))].count("c_refund") == 1


def test_user_text_interrupts_a_held_call_and_closes_its_approval(store: Store) -> None:
    h, _ = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    h.send(t, "never mind")
    h.settle(t)
    assert h.pending_approvals() == []
    with pytest.raises(AlreadyDecided):
        h.approve(t, "c_refund", by="alice")
    assert not any(name == "refund" for name, _ in RAN)


def test_the_model_never_sees_approval_items(store: Store) -> None:
    h, model = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    h.approve(t, "c_refund", by="alice")
    h.settle(t)
    kinds = {type(i) for i in h.history(t)}
    assert {ApprovalRequest, ApprovalDecision} <= kinds  # the audit trail is in the history
    parts = flatten(model.requests[-1].items)
    assert not any("approval" in repr(p).lower() for p in parts)


def test_a_childs_approval_is_listed_on_its_root(store: Store) -> None:
    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText):
            return reply("", call("spawn_thread", instructions="refund o9"))
        if isinstance(last, ToolResult) and last.content.startswith("You are now inside"):
            return reply("", call("refund", "c_child", order_id="o9", amount=120.0))
        return reply("waiting")

    agent = Agent("clerk", model=ScriptedModel(script), tools=[refund], threads=True)
    h = Harness(agent, store=store)
    root = h.launch("clerk", "delegate")
    h.drain()
    [held] = h.pending_approvals(root_id=root)
    assert held.thread_id != root and held.root_id == root and held.call_id == "c_child"
    assert h.pending_approvals(root_id="thr_other") == []
    h.approve(held.thread_id, "c_child", by="alice", digest=held.digest)
    h.drain()
    assert RAN == [("refund", {"order_id": "o9", "amount": 120.0})]


def test_a_client_without_the_agents_code_leaves_the_edit_check_to_the_slice(
    store: Store,
) -> None:
    h, _ = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    agents, h.agents = h.agents, None  # a bare Client: it cannot check the schema
    h.edit(t, "c_refund", {"order_id": "o1", "amount": "lots"}, by="carol")
    h.agents = agents
    h.settle(t)
    [result] = [r for r in results(h.history(t)) if r.call_id == "c_refund"]
    assert result.is_error and "were refused" in result.content and "amount" in result.content
    assert not any(name == "refund" for name, _ in RAN)


def test_local_system_holds_and_decides_with_its_own_loop(tmp_path: Any) -> None:
    from dormant import LocalSystem

    model = _script(_refund_and_lookup())
    agent = Agent("clerk", model=model, tools=[refund, lookup])
    with LocalSystem([agent], database_url=f"sqlite:///{tmp_path}/d.db") as system:
        t = system.launch("clerk", "refund o1")
        system.run_until_idle()
        [held] = system.pending_approvals()
        assert system.thread(t).status.value == "waiting"
        system.approve(t, held.call_id, by="alice", digest=held.digest)
        system.run_until_idle()
        assert RAN.count(("refund", {"order_id": "o1", "amount": 250.0})) == 1
        assert system.thread(t).status.value == "idle"


@pytest.mark.parametrize("open_store", ["sqlite", "postgres"], indirect=True)
def test_two_processes_racing_to_decide_run_the_tool_once(open_store: Any) -> None:
    import threading

    h, _ = _harness(open_store(), _refund_and_lookup())
    other, _ = _harness(open_store(), _refund_and_lookup())  # another process's client
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def decide(client: Harness, how: str) -> None:
        start.wait()
        try:
            if how == "approve":
                client.approve(t, "c_refund", by=how)
            else:
                client.reject(t, "c_refund", by=how)
            outcomes.append(how)
        except AlreadyDecided:
            outcomes.append("already decided")

    racers = [
        threading.Thread(target=decide, args=(h, "approve")),
        threading.Thread(target=decide, args=(other, "reject")),
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=30)
    assert sorted(outcomes).count("already decided") == 1
    h.settle(t)
    [result] = [r for r in results(h.history(t)) if r.call_id == "c_refund"]
    assert [name for name, _ in RAN].count("refund") == (0 if result.is_error else 1)
    decisions = [i for i in h.history(t) if isinstance(i, ApprovalDecision)]
    assert len(decisions) == 1


def test_a_crash_between_the_decision_and_the_dispatch_dispatches_once(store: Store) -> None:
    h, _ = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    h.approve(t, "c_refund", by="alice")
    h.crash_at("after_commit", lambda: h.step(t))  # the decision is applied, not dispatched
    assert h.outbox == []
    h.sweep()  # the sweeper finds the undispatched row
    h.sweep()
    h.settle(t)
    assert [name for name, _ in RAN].count("refund") == 1
    assert len([r for r in results(h.history(t)) if r.call_id == "c_refund"]) == 1


@pytest.mark.parametrize("open_store", ["sqlite", "postgres"], indirect=True)
def test_a_timeout_fires_exactly_once_across_a_restart(open_store: Any) -> None:
    h, _ = _harness(open_store(), _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    h.store.close()  # the process dies with the approval pending
    later = datetime.now(UTC) + timedelta(days=2)
    first, second = open_store(), open_store()  # two sweepers of the restarted deployment
    fired = first.fire_due_timers(later) + second.fire_due_timers(later)
    assert [row.message_id for row in fired] == ["approval:c_refund"]
    restarted, _ = _harness(open_store(), _refund_and_lookup())
    restarted.settle(t)
    assert len([r for r in results(restarted.history(t)) if r.call_id == "c_refund"]) == 1
    assert not any(name == "refund" for name, _ in RAN)


def test_the_invariant_checker_finds_nothing_wrong_with_approvals(store: Store) -> None:
    from dormant.ops.check import check_store

    h, _ = _harness(store, _refund_and_lookup())
    approved, rejected, held = (h.launch("clerk", f"refund {n}") for n in range(3))
    for t in (approved, rejected, held):
        h.settle(t)
    h.approve(approved, "c_refund", by="alice")
    h.reject(rejected, "c_refund", by="bob")
    for t in (approved, rejected):
        h.settle(t)
    assert check_store(h.store) == []


def test_on_approval_requested_runs_off_the_slice_once_per_held_call(store: Store) -> None:
    told: list[Any] = []
    h, _ = _harness(store, _refund_and_lookup(), on_approval_requested=told.append)
    t = h.launch("clerk", "refund o1")
    h.step(t)
    assert told == []  # not in the slice: an outbox row, run like a tool
    assert sorted(row.action for row in h.outbox) == ["notify", "tool"]
    h.settle(t)
    [notice] = told
    assert (notice.thread_id, notice.call_id, notice.prompt) == (
        t,
        "c_refund",
        "Refund 250.0 to o1?",
    )
    h.sweep(lost=True)  # a re-sent row finds it ran: nobody is told twice
    h.run_tools()
    assert len(told) == 1


def test_a_failing_hook_is_logged_and_the_call_still_awaits(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_approval: Any) -> None:
        raise RuntimeError("slack is down")

    h, _ = _harness(store, _refund_and_lookup(), on_approval_requested=broken)
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    assert "slack is down" in caplog.text
    assert [p.call_id for p in h.pending_approvals()] == ["c_refund"]


def test_a_call_decided_before_its_notice_runs_tells_nobody(store: Store) -> None:
    told: list[Any] = []
    h, _ = _harness(store, _refund_and_lookup(), on_approval_requested=told.append)
    t = h.launch("clerk", "refund o1")
    h.step(t)
    h.reject(t, "c_refund", by="bob")
    h.settle(t)
    assert told == []


def test_dormant_show_renders_the_audit_trail(store: Store) -> None:
    from dormant.ops.timeline import render_item

    h, _ = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    h.reject(t, "c_refund", by="bob", reason="duplicate", channel="cli")
    h.settle(t)
    lines = [render_item(i).plain for i in h.history(t)]
    assert any(line.startswith("approval? ") and "refund(" in line for line in lines)
    assert any("reject [c_refund] by bob via cli: duplicate" in line for line in lines)
