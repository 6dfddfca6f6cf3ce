"""Code changing under live threads: a worker never answers for a name it does not have.

A rolling deploy runs old and new code on the same queues. A slice or tool run that lands
on a worker without its agent or tool is left for one that has it (``runtime/whereabouts``)
and answered only once no live worker has had the name for ``name_gone_after_s``; renamed
agents and tools keep their threads and calls through aliases, and a changed signature is
upgraded or refused readably.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dormant import Agent, LocalSystem, Settings, ToolContext, tool
from dormant.agents import AgentRegistry
from dormant.errors import UnknownThread
from dormant.messages import Item, ToolResult
from dormant.models import ScriptedModel, reply
from dormant.models.base import Completion
from dormant.models.scripted import call
from dormant.runtime.outcomes import Failed, Idle, Left, Waiting
from dormant.runtime.whereabouts import Elsewhere, Gone, Whereabouts, card_of, locate
from dormant.stores.base import (
    CallState,
    InboxState,
    OutboxRow,
    Store,
    ThreadStatus,
    WorkerCard,
)
from dormant.tools.base import Tool
from dormant.tools.outcomes import Answered, CancelHookRan, NotHere, Raised
from dormant.tools.runner import execute_outbox
from tests.harness import Harness

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


@tool
def status(build: int) -> str:
    """The status of a build."""
    return f"build {build}: green"


@tool
def scan(repo: str) -> str:
    """Scan a repository (only the new code has this tool)."""
    return f"{repo}: 0 findings"


def _calls(name: str, **args: Any) -> ScriptedModel:
    def script(items: Sequence[Item]) -> Completion:
        if isinstance(items[-1], ToolResult):
            return reply(f"answered: {items[-1].content}")
        return reply("", call(name, **args))

    return ScriptedModel(script, name="gpt-4.1-mini")


def _agent(*tools: Tool, name: str = "triage", **options: Any) -> Agent:
    return Agent(name, model=_calls("scan", repo="api"), tools=list(tools), **options)


def _roster(h: Harness, *agents: Agent, gone_after_s: float = 900.0) -> Whereabouts:
    """A worker with ``agents`` announced in ``h``'s store, as a deployed process does."""
    where = Whereabouts(
        h.store, AgentRegistry(agents), announce_interval_s=30.0, gone_after_s=gone_after_s
    )
    where.announce()
    return where


def _card(agents: Sequence[Agent], seen_at: datetime) -> WorkerCard:
    card = card_of(AgentRegistry(agents), "w-1", "host-1", seen_at - HOUR)
    return replace(card, seen_at=seen_at)


# Where a name runs: the roster's answers ------------------------------------------------


def test_a_name_a_live_worker_has_is_elsewhere() -> None:
    roster = [_card([_agent(status, scan)], NOW - timedelta(seconds=10))]
    where = locate(roster, "triage", "scan", NOW - HOUR, NOW, live_s=90, gone_after_s=900)
    assert isinstance(where, Elsewhere) and "worker w-1 has it" in where.why


def test_a_name_last_seen_a_moment_ago_may_come_back_and_is_not_gone_yet() -> None:
    roster = [_card([_agent(status, scan)], NOW - timedelta(seconds=600))]
    where = locate(roster, "triage", "scan", NOW - HOUR, NOW, live_s=90, gone_after_s=900)
    assert isinstance(where, Elsewhere) and "until 2026-12-03 12:05:00 UTC" in where.why


def test_a_name_never_announced_waits_from_when_the_work_arrived() -> None:
    """A new agent launched by the web app before any new worker is up is not stalled by
    the old workers: the wait counts from the work, not from a worker that never was."""
    fresh = locate([], "ops", None, NOW - timedelta(seconds=5), NOW, live_s=90, gone_after_s=900)
    assert isinstance(fresh, Elsewhere)
    old = locate([], "ops", None, NOW - HOUR, NOW, live_s=90, gone_after_s=900)
    assert old == Gone("agent 'ops' is not deployed on any live worker (never announced)")


def test_a_tool_the_live_workers_no_longer_have_was_removed_in_their_version() -> None:
    old = _card([_agent(status, scan, version="v1")], NOW - 2 * HOUR)
    new = _card([_agent(status, version="v2")], NOW)
    where = locate([old, new], "triage", "scan", NOW - HOUR, NOW, live_s=90, gone_after_s=900)
    assert where == Gone(
        "tool 'scan' of agent 'triage' was removed in version v2 of agent 'triage' "
        "(last seen 2026-12-03 10:00 UTC on a worker)"
    )


def test_an_agent_version_is_a_fingerprint_of_what_the_model_sees_unless_named() -> None:
    assert _agent(status).fingerprint == _agent(status).fingerprint
    assert _agent(status).fingerprint != _agent(status, scan).fingerprint
    assert _agent(status, instructions="Be brief.").fingerprint != _agent(status).fingerprint
    assert _agent(status, version="2026-12-03").fingerprint == "2026-12-03"


def test_a_workers_card_lists_its_agents_tools_and_aliases() -> None:
    agent = _agent(status, name="support", aliases=["helpdesk"])
    card = card_of(AgentRegistry([agent]), "w-1", "host-1", NOW)
    assert set(card.agents) == {"support", "helpdesk"}
    assert {"status", "sleep", "close_thread"} <= card.agents["support"].tools
    assert "spawn_thread" not in card.agents["support"].tools  # threads=False


# Tool runs during a deploy -----------------------------------------------------------------


def test_a_tool_run_on_a_worker_without_the_tool_is_left_for_one_that_has_it() -> None:
    new_agent = _agent(status, scan)
    h = Harness(new_agent)
    thread_id = h.launch("triage", "scan the api")
    h.step(thread_id)
    (row,) = h.outbox
    _roster(h, new_agent)  # the new worker is up
    old = AgentRegistry([_agent(status)])
    old_where = _roster(h, *old.values())

    outcome = execute_outbox(row, h.store, old, h, h.callback_url, whereabouts=old_where)

    assert isinstance(outcome, NotHere) and "scan" in outcome.why
    assert h.store.call(thread_id, row.call_id).state is CallState.PENDING
    assert h.store.inbox(thread_id, InboxState.PENDING) == [], "no result for a tool not run"
    outcome = execute_outbox(row, h.store, h.deps.agents, h, h.callback_url)
    assert outcome == Answered()
    h.settle(thread_id)
    assert h.history(thread_id)[-1].text == "answered: api: 0 findings"  # type: ignore[union-attr]


def test_a_left_run_gives_its_claim_back_uncounted_and_the_next_sweep_sends_it_again() -> None:
    h = Harness(_agent(status, scan))
    thread_id = h.launch("triage", "scan the api")
    h.step(thread_id)
    (row,) = h.outbox
    h.store.mark_dispatched([row.id])
    assert h.store.claim_outbox(row.id, NOW + HOUR) == 1
    h.store.unclaim_outbox(row.id)
    (again,) = h.store.undispatched(datetime.now(UTC))
    assert again.id == row.id and again.dispatched_at is None
    assert h.store.claim_outbox(row.id, datetime.now(UTC) + HOUR) == 1, "not counted as a run"


def test_a_tool_gone_from_every_live_worker_is_answered_saying_so() -> None:
    h = Harness(_agent(status, scan))
    thread_id = h.launch("triage", "scan the api")
    h.step(thread_id)
    (row,) = h.outbox
    old = AgentRegistry([_agent(status, version="v2")])
    where = _roster(h, *old.values(), gone_after_s=0.0)

    outcome = execute_outbox(row, h.store, old, h, h.callback_url, whereabouts=where)

    why = "tool 'scan' of agent 'triage' was removed in version v2 of agent 'triage'"
    assert isinstance(outcome, Raised) and outcome.error.startswith(why)
    h.settle(thread_id)
    (result,) = [i for i in h.history(thread_id) if isinstance(i, ToolResult)]
    assert result.is_error and result.content.startswith(f"Error: {why}")


def test_a_cancel_hook_gone_with_its_tool_is_reported_not_skipped_silently() -> None:
    cancelled: list[str] = []

    def unregister(ctx: ToolContext) -> None:
        cancelled.append(ctx.call_id)

    @tool(subscription=True, on_cancel=unregister)
    def watch(repo: str) -> str:
        """Watch a repository's pull requests."""
        return "watching"

    h = Harness(Agent("triage", model=_calls("watch", repo="api"), tools=[watch]))
    thread_id = h.launch("triage", "watch the api")
    h.settle(thread_id)
    h.close_thread(thread_id, reason="done")
    (cancel,) = [r for r in h.outbox if r.action == "cancel"]
    old = AgentRegistry([_agent(status)])

    holder = _roster(h, _agent(watch))
    left = execute_outbox(cancel, h.store, old, h, h.callback_url, whereabouts=holder)
    assert isinstance(left, NotHere), "the hook is left for the worker that still has it"

    h.store.announce(replace(holder.card, seen_at=NOW - HOUR), NOW - 2 * HOUR)  # it stopped
    gone = _roster(h, *old.values(), gone_after_s=0.0)
    outcome = execute_outbox(cancel, h.store, old, h, h.callback_url, whereabouts=gone)
    assert isinstance(outcome, CancelHookRan) and not outcome.hook
    assert outcome.error is not None and "not run" in outcome.error and "'watch'" in outcome.error
    assert cancelled == []


# Slices during a deploy ----------------------------------------------------------------


def test_a_slice_without_its_agent_leaves_the_thread_for_a_worker_that_has_it() -> None:
    ops = Agent("ops", model=ScriptedModel(lambda _items: reply("on it")))
    h = Harness(ops)
    thread_id = h.launch("ops", "deploy")
    _roster(h, ops)  # a new worker has "ops"
    old = AgentRegistry([_agent(status)])
    old_deps = replace(h.deps, agents=old, whereabouts=_roster(h, *old.values()))

    from dormant.runtime.slice import run_slice

    outcome = run_slice(thread_id, old_deps)

    assert isinstance(outcome, Left) and "agent 'ops'" in outcome.why
    info = h.store.thread(thread_id)
    assert info.status is not ThreadStatus.STALLED and info.failures == 0 and not info.last_error
    assert info.retry_at is not None, "the sweeper leaves it to others for a moment"
    assert [r.message_id for r in h.store.inbox(thread_id, InboxState.PENDING)], "nothing consumed"
    assert isinstance(h.step(thread_id), Idle)
    assert h.history(thread_id)[-1].text == "on it"  # type: ignore[union-attr]


def test_a_thread_whose_agent_is_gone_from_every_worker_stalls_saying_so() -> None:
    h = Harness(Agent("ops", model=ScriptedModel(lambda _items: reply("on it"))))
    thread_id = h.launch("ops", "deploy")
    old = AgentRegistry([_agent(status)])
    deps = replace(h.deps, agents=old, whereabouts=_roster(h, *old.values(), gone_after_s=0.0))

    from dormant.runtime.slice import run_slice

    outcome = run_slice(thread_id, deps)

    assert isinstance(outcome, Failed) and outcome.stalled
    assert outcome.error == "agent 'ops' is not deployed on any live worker (never announced)"
    assert h.store.thread(thread_id).last_error == outcome.error


# Renames and changed signatures --------------------------------------------------------


@tool
def lookup(id: int) -> str:
    """Look an order up (the old name and signature)."""
    return f"order {id}"


def from_lookup(args: dict[str, Any]) -> dict[str, Any]:
    """docs/upgrades.md's: calls made before the rename passed ``id``; current calls pass
    through unchanged."""
    return {"order_id": args.pop("id"), **args} if "id" in args else args


def _renamed_find_order(**options: Any) -> Tool:
    @tool(aliases=["lookup"], **options)
    def find_order(order_id: int, include_lines: bool = False) -> str:
        """Find an order (renamed from lookup, its id renamed too)."""
        return f"order {order_id} (lines: {include_lines})"

    return find_order


def _old_call(h: Harness) -> tuple[str, OutboxRow]:
    """A thread of the old code with a call to ``lookup`` dispatched and not run yet."""
    thread_id = h.launch("helpdesk", "where is order 7?")
    h.step(thread_id)
    (row,) = h.outbox
    h.outbox.clear()
    return thread_id, row


def test_a_renamed_agent_and_tool_run_old_threads_and_calls_through_aliases() -> None:
    old = Agent("helpdesk", model=_calls("lookup", id=7), tools=[lookup])
    h = Harness(old)
    thread_id, row = _old_call(h)
    find_order = _renamed_find_order(upgrade_args=from_lookup)
    assert find_order.invoke({"order_id": 8}, None) == "order 8 (lines: False)"  # type: ignore[arg-type]
    model = _calls("find_order", order_id=7)
    new = Agent("support", aliases=["helpdesk"], model=model, tools=[find_order])
    h.deps = replace(h.deps, agents=AgentRegistry([new]))

    outcome = execute_outbox(row, h.store, h.deps.agents, h, h.callback_url)

    assert outcome == Answered()
    h.settle(thread_id)
    assert h.history(thread_id)[-1].text == "answered: order 7 (lines: False)"  # type: ignore[union-attr]
    assert h.store.thread(thread_id).agent == "helpdesk", "the stored name is data: kept"


def test_a_stored_call_that_fails_a_changed_signature_gets_the_same_error_as_a_new_call() -> None:
    h = Harness(Agent("helpdesk", model=_calls("lookup", id=7), tools=[lookup]))
    thread_id, row = _old_call(h)
    new = Agent("helpdesk", model=_calls("find_order"), tools=[_renamed_find_order()])
    h.deps = replace(h.deps, agents=AgentRegistry([new]))

    outcome = execute_outbox(row, h.store, h.deps.agents, h, h.callback_url)

    assert isinstance(outcome, Raised)
    h.settle(thread_id)
    (result,) = [i for i in h.history(thread_id) if isinstance(i, ToolResult)]
    assert result.is_error
    assert result.content.startswith("Error: invalid arguments for tool 'find_order': ")
    assert "order_id: Field required" in result.content and "Traceback" not in result.content


def test_aliases_that_clash_are_refused_when_the_agents_are_registered() -> None:
    from dormant.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="alias 'triage', which names 'triage'"):
        AgentRegistry([_agent(status), _agent(status, name="ops", aliases=["triage"])])
    with pytest.raises(ConfigurationError, match="duplicate tools"):
        _agent(status, _renamed_find_order(), lookup)


# The embedded runtime: two processes of two versions on one SQLite file ---------------


def test_two_local_systems_on_one_sqlite_file_leave_each_other_what_they_lack(
    tmp_path: Path,
) -> None:
    """A process without the new agent leaves its threads' slices to the process that has
    it: never stalled, nothing consumed, and the new process answers them."""
    url = f"sqlite:///{tmp_path}/deploy.db"
    settings = Settings(sweep_interval_s=0.2)
    ops = Agent("ops", model=ScriptedModel(lambda items: reply(f"new code: {len(items)}")))
    with LocalSystem([ops], url, settings=settings) as first:
        thread_ids = [first.launch("ops", f"deploy {n}") for n in range(3)]
        first.run_until_idle()
    with LocalSystem([_agent(status)], url, settings=settings) as old:
        for thread_id in thread_ids:
            old.send(thread_id, "and again")  # the old process wakes them: it lacks "ops"
        deadline = time.monotonic() + 30
        while old.slices_run < len(thread_ids):
            assert time.monotonic() < deadline, "the old process never took the slices"
            time.sleep(0.01)  # polling the old process's pool, with a deadline
        for thread_id in thread_ids:
            info = old.thread(thread_id)
            assert (
                info.failures == 0
                and not info.last_error
                and info.status is not ThreadStatus.STALLED
            )
            assert len(old.store.inbox(thread_id, InboxState.PENDING)) == 1, "not consumed"
        with LocalSystem([ops], url, settings=settings) as new:
            new.run_until_idle(timeout_s=30)
            for thread_id in thread_ids:
                assert new.history(thread_id)[-1].text == "new code: 3"  # type: ignore[union-attr]
                assert new.thread(thread_id).status is ThreadStatus.IDLE


def test_a_local_system_whose_agent_is_gone_stalls_its_threads_saying_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/gone.db"
    ops = Agent("ops", model=ScriptedModel(lambda _items: reply("on it")))
    with LocalSystem([ops], url) as before:
        thread_id = before.launch("ops", "deploy")
        before.run_until_idle()
    after_settings = Settings(name_gone_after_s=0.0, announce_interval_s=0.01)
    with LocalSystem([_agent(status)], url, settings=after_settings) as after:
        after.send(thread_id, "deploy again")
        report = after.run_until_idle(raise_on_failure=False)
    (failed,) = report.failed
    assert failed.thread_id == thread_id
    assert "agent 'ops' is not deployed on any live worker (last seen" in failed.error


def test_dormant_versions_prints_a_bracketed_version_as_written(tmp_path: Path) -> None:
    """A version is text, not Rich markup: ``[rc1]`` is shown, not swallowed as a style."""
    from typer.testing import CliRunner

    from dormant.cli import app

    url = f"sqlite:///{tmp_path}/versions.db"
    agent = Agent("triage", model=ScriptedModel(lambda _: reply("hi")), version="[rc1]")
    with LocalSystem([agent], url):
        table = CliRunner().invoke(app, ["versions", "--database-url", url], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "[rc1]" in table.output


def test_dormant_versions_shows_each_agent_version_its_open_threads_and_live_workers(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from dormant.cli import app

    url = f"sqlite:///{tmp_path}/versions.db"
    triage_v1 = Agent("triage", model=ScriptedModel(lambda _: reply("v1")), version="v1")
    with LocalSystem([triage_v1], url) as old:
        old_id = old.whereabouts.card.worker_id  # type: ignore[union-attr]
        first = old.launch("triage", "hello")
        old.run_until_idle()
    with LocalSystem([_agent(status, scan, version="v2")], url) as new:
        new_id = new.whereabouts.card.worker_id  # type: ignore[union-attr]
        second = new.launch("triage", "scan the api")
        new.run_until_idle()
        assert (new.thread(first).code_version, new.thread(second).code_version) == ("v1", "v2")
        shown = CliRunner().invoke(app, ["show", second, "--json", "--database-url", url])
        assert json.loads(shown.output)["thread"]["code_version"] == "v2"
        shown = CliRunner().invoke(app, ["versions", "--database-url", url, "--json"])
        table = CliRunner().invoke(app, ["versions", "--database-url", url], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    records = {(r["agent"], r["version"]): r for r in json.loads(shown.output)}
    assert set(records) == {("triage", "v1"), ("triage", "v2")}
    assert records["triage", "v2"]["tools"] == ["scan", "status"]
    assert records["triage", "v1"]["tools"] == []
    assert records["triage", "v1"]["open_threads"] == records["triage", "v2"]["open_threads"] == 1
    assert records["triage", "v2"]["live_workers"] == [new_id]
    assert records["triage", "v1"]["live_workers"] == [], f"{old_id} closed: v1 is drained"
    assert table.exit_code == 0 and "v2" in table.output and "none: drained" in table.output


def test_check_upgrade_reports_each_thing_new_code_could_not_run_in_the_open_threads(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from dormant.cli import app
    from dormant.stores.sql.store import upgrade

    @tool(deferred=True)
    def old_lookup(id: int, ctx: ToolContext) -> None:
        """Look an order up (the old signature)."""

    @tool(subscription=True)
    def watch(repo: str) -> str:
        """Watch a repository."""
        return "watching"

    @tool(deferred=True)
    def deferred_scan(repo: str, ctx: ToolContext) -> None:
        """Start a scan."""

    url = f"sqlite:///{tmp_path}/check.db"
    scan_v1, lookup_v1 = replace(deferred_scan, name="scan"), replace(old_lookup, name="lookup")
    old = [
        Agent("ops", model=ScriptedModel(lambda _items: reply("on it"))),
        Agent("triage", model=_calls("scan", repo="api"), tools=[scan_v1]),
        Agent("helpdesk", model=_calls("lookup", id=7), tools=[lookup_v1]),
        Agent("watcher", model=_calls("watch", repo="api"), tools=[watch]),
    ]
    with LocalSystem(old, url) as system:
        ids = {a.name: system.launch(a.name, "go") for a in old}
        closed = system.launch("ops", "and go away")
        system.run_until_idle()
        system.close_thread(closed, reason="done")
        system.run_until_idle()

    command = ["check", "--upgrade", "--agents", "tests.deploy_check_agents", "--database-url"]
    found = CliRunner().invoke(app, [*command, url])

    assert found.exit_code == 1, found.output
    lines = found.output.splitlines()
    assert lines[-1] == "4 problem(s) for tests.deploy_check_agents in the open threads"
    by_thread = {line.split(": ", 1)[0]: line for line in lines[:-1]}
    assert set(by_thread) == set(ids.values()), "the closed thread is not reported"
    assert "agent gone: agent 'ops' is not defined" in by_thread[ids["ops"]]
    assert "tool gone: call" in by_thread[ids["triage"]]
    assert "'scan' is pending; agent 'triage' has no such tool" in by_thread[ids["triage"]]
    assert "arguments invalid" in by_thread[ids["helpdesk"]]
    assert "order_id: Field required" in by_thread[ids["helpdesk"]]
    assert "cancel hook gone" in by_thread[ids["watcher"]]
    upgrade(f"sqlite:///{tmp_path}/new.db")
    fine = CliRunner().invoke(app, [*command, f"sqlite:///{tmp_path}/new.db"])
    assert fine.exit_code == 0, fine.output
    assert fine.output == "no problems found in the open threads\n"


def test_dormant_retry_status_stalled_re_drives_every_stalled_thread_of_an_agent(
    tmp_path: Path,
) -> None:
    """After a deploy brings back a missing agent, its stalled threads go on in one call."""
    from typer.testing import CliRunner

    from dormant.cli import app

    url = f"sqlite:///{tmp_path}/retry.db"
    agents = [Agent(n, model=ScriptedModel(lambda _items: reply("ok"))) for n in ("ops", "x")]
    with LocalSystem(agents, url) as system:
        ops = [system.launch("ops", f"deploy {n}") for n in range(3)]
        other = system.launch("x", "stay stalled")
        system.run_until_idle()
        for thread_id in [*ops, other]:
            system.store.record_failure(thread_id, "agent 'ops' is not deployed", stall_after=1)

    done = CliRunner().invoke(
        app, ["retry", "--status", "stalled", "--agent", "ops", "--database-url", url]
    )

    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[-1] == "3 stalled thread(s) re-driven of agent ops"
    with LocalSystem(agents, url) as system:
        assert {system.thread(t).status for t in ops} == {ThreadStatus.IDLE}
        assert system.thread(other).status is ThreadStatus.STALLED
    both = CliRunner().invoke(app, ["retry", ops[0], "--status", "stalled", "--database-url", url])
    assert both.exit_code == 2 and "not both" in both.output


def test_once_newer_code_is_up_older_workers_leave_the_agents_turns_and_tool_runs() -> None:
    """A rolling deploy: from the moment a v2 worker is up, the v1 worker still up leaves
    every turn and tool run of the agent to v2, whichever version ran the thread last (its
    turns never alternate, and none runs on old code once new code is up); when no v2
    worker is live any more (a deploy rolled back by stopping it), v1 runs them again."""
    from dormant.runtime.slice import run_slice

    v1 = Agent("triage", model=_calls("status", build=7), tools=[status], version="v1")
    v2 = Agent("triage", model=_calls("status", build=7), tools=[status], version="v2")
    h = Harness(v2)
    old = _roster(h, v1)  # deployed first
    h.deps = replace(h.deps, whereabouts=_roster(h, v2))
    old_deps = replace(h.deps, agents=AgentRegistry([v1]), whereabouts=old)

    thread_id = h.launch("triage", "hello")
    left = run_slice(thread_id, old_deps)
    assert isinstance(left, Left) and "version v2 was deployed after this worker's v1" in left.why
    assert h.history(thread_id) == [], "nothing written by v1"
    assert isinstance(h.step(thread_id), Waiting)
    (row,) = h.outbox
    ran = execute_outbox(row, h.store, old_deps.agents, h, h.callback_url, whereabouts=old)
    assert isinstance(ran, NotHere), "v1 has the tool, but v2 is up: v2 runs it"
    assert h.store.call(thread_id, row.call_id).state is CallState.PENDING
    assert execute_outbox(row, h.store, h.deps.agents, h, h.callback_url) == Answered()
    h.settle(thread_id)
    assert [s.code_version for s in h.thread_versions(thread_id)] == ["v2"]

    later = datetime.now(UTC) + HOUR  # the v2 worker stopped: its card lapsed
    h.send(thread_id, "and again")
    assert isinstance(run_slice(thread_id, replace(old_deps, clock=lambda: later)), Waiting)
    assert [s.code_version for s in h.thread_versions(thread_id)] == ["v2", "v1"]


# Which code ran each slice ---------------------------------------------------------------


def test_a_thread_records_which_version_ran_each_of_its_slices(store: Store) -> None:
    """One span while one version runs the thread; a deploy that meets it starts a span at
    the first item the new code made, and the record survives on every store."""
    v1 = Agent("triage", model=ScriptedModel(lambda _items: reply("v1")), version="v1")
    v2 = Agent("triage", model=ScriptedModel(lambda _items: reply("v2")), version="v2")
    h = Harness(v1, store=store)
    thread_id = h.launch("triage", "hello")
    h.step(thread_id)
    h.send(thread_id, "again")
    h.step(thread_id)
    (only,) = h.thread_versions(thread_id)
    assert (only.from_seq, only.code_version) == (1, "v1")
    assert only.since == h.thread(thread_id).created_at

    new = Harness(v2, store=store)
    new.send(thread_id, "after the deploy")
    new.step(thread_id)
    new.send(thread_id, "and once more")
    new.step(thread_id)
    spans = new.thread_versions(thread_id)
    assert [(s.from_seq, s.code_version) for s in spans] == [(1, "v1"), (5, "v2")]
    texts = [(s.seq, getattr(s.item, "text", "")) for s in new.stored_history(thread_id)]
    assert texts[3:6] == [(4, "v1"), (5, "after the deploy"), (6, "v2")], "v2 made #5 on"
    assert spans[1].since >= spans[0].since


def test_a_version_change_is_pruned_with_its_thread(store: Store) -> None:
    v1 = Agent("triage", model=ScriptedModel(lambda _items: reply("v1")), version="v1")
    v2 = Agent("triage", model=ScriptedModel(lambda _items: reply("v2")), version="v2")
    old, new = Harness(v1, store=store), Harness(v2, store=store)
    thread_id = old.launch("triage", "hello")
    old.step(thread_id)
    new.send(thread_id, "after the deploy")
    new.step(thread_id)
    assert len(new.thread_versions(thread_id)) == 2
    new.close_thread(thread_id)
    counts = store.prune_batch(datetime.now(UTC) + HOUR, limit=1000)
    assert counts.threads == 1
    with pytest.raises(UnknownThread):
        new.thread_versions(thread_id)


def test_dormant_show_says_which_version_ran_which_items(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dormant.cli import app

    url = f"sqlite:///{tmp_path}/spans.db"
    v1 = Agent("triage", model=ScriptedModel(lambda _items: reply("v1")), version="v1")
    v2 = Agent("triage", model=ScriptedModel(lambda _items: reply("v2")), version="v2")
    with LocalSystem([v1], url) as old:
        thread_id = old.launch("triage", "hello")
        old.run_until_idle()
    with LocalSystem([v2], url) as new:
        new.send(thread_id, "after the deploy")
        new.run_until_idle()
    shown = CliRunner().invoke(app, ["show", thread_id, "--json", "--database-url", url])
    assert shown.exit_code == 0, shown.output
    versions = json.loads(shown.output)["versions"]
    assert [(v["from_seq"], v["code_version"]) for v in versions] == [(1, "v1"), (3, "v2")]
    text = CliRunner().invoke(app, ["show", thread_id, "--database-url", url])
    assert "version v2 (v1 until #2)" in text.output
    assert "----- version v2 -----" in text.output


def test_a_parent_whose_child_stalled_says_so_where_it_shows_idle(tmp_path: Path) -> None:
    """The parent waits for its child's reports, idle: ``dormant show`` and its record say
    which child stalled and why, instead of nothing."""
    from typer.testing import CliRunner

    from dormant.cli import app

    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, ToolResult) and last.content.startswith("You are now inside"):
            raise ValueError("the child's model is misconfigured")  # the child's every turn
        if isinstance(last, ToolResult):
            return reply("spawned; waiting for its report")
        return reply("", call("spawn_thread", instructions="do it"))

    lead = Agent("lead", model=ScriptedModel(script), threads=True)
    url = f"sqlite:///{tmp_path}/family.db"
    settings = Settings(stall_after_failures=1, model_attempts=1, failure_backoff_s=0.0)
    with LocalSystem([lead], url, settings=settings) as system:
        root = system.launch("lead", "start a helper")
        system.run_until_idle(raise_on_failure=False)
        (kid,) = system.store.children(root)
        assert system.thread(kid.id).status is ThreadStatus.STALLED
        assert system.thread(root).status is ThreadStatus.IDLE
    record = CliRunner().invoke(app, ["show", root, "--json", "--database-url", url])
    (stalled,) = json.loads(record.output)["thread"]["stalled_children"]
    assert stalled["id"] == kid.id and "misconfigured" in stalled["last_error"]
    text = CliRunner().invoke(app, ["show", root, "--database-url", url], env={"COLUMNS": "300"})
    assert f"child {kid.id} stalled" in text.output


def test_tool_runs_of_an_agent_no_worker_has_wait_pending_and_run_when_it_is_back() -> None:
    """Every worker lost the agent for a while (a bad deploy rolled back): its threads'
    tool runs are left, never answered "unknown agent", and run once it is deployed again."""
    ops = Agent("ops", model=_calls("status", build=9), tools=[status])
    h = Harness(ops)
    thread_id = h.launch("ops", "how is build 9?")
    h.step(thread_id)
    (row,) = h.outbox
    _roster(h, ops).withdraw()  # the last worker with "ops" stopped moments ago
    without = AgentRegistry([_agent(status)])
    where = _roster(h, *without.values())
    for _ in range(3):  # every sweep sends it again; each run leaves it
        left = execute_outbox(row, h.store, without, h, h.callback_url, whereabouts=where)
        assert isinstance(left, NotHere) and "agent 'ops'" in left.why
    assert h.store.call(thread_id, row.call_id).state is CallState.PENDING
    assert h.store.inbox(thread_id, InboxState.PENDING) == [], "nothing answered for it"

    back = _roster(h, ops)  # deployed again
    ran = execute_outbox(row, h.store, h.deps.agents, h, h.callback_url, whereabouts=back)
    assert ran == Answered()
    h.settle(thread_id)
    assert h.history(thread_id)[-1].text == "answered: build 9: green"  # type: ignore[union-attr]


def test_an_old_worker_restarted_mid_roll_does_not_take_the_turns_back() -> None:
    """A version's deploy is the first start of a worker that announced it: a v1 worker
    that crashed and restarted after the v2 workers came up is still the older code."""
    v1 = Agent("triage", model=_calls("status", build=1), tools=[status], version="v1")
    v2 = Agent("triage", model=_calls("status", build=2), tools=[status], version="v2")
    h = Harness(v2)
    _roster(h, v1)  # the fleet before the deploy
    new = _roster(h, v2)
    restarted = _roster(h, v1)  # an old pod's container restarted after v2 came up
    later = datetime.now(UTC) + timedelta(seconds=5)  # past the roster's read cache
    assert new.superseded("triage", later) is None, "v2 keeps the turns"
    left = restarted.superseded("triage", later)
    assert left is not None and "version v2 was deployed after this worker's v1" in left.why


def test_dormant_versions_cuts_no_version_or_worker_id_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 80 columns the table folded nothing: it cut ids to ``web-7f9c:14:1a…``, which a
    deploy's drain is checked by. Folded in a terminal, and a row a line when piped."""
    from typer.testing import CliRunner

    from dormant.cli import app

    url = f"sqlite:///{tmp_path}/versions.db"
    version = "2026.12.06-build.4711-" + "f" * 12
    with LocalSystem([_agent(status, scan, version=version)], url) as system:
        worker_id = system.whereabouts.card.worker_id  # type: ignore[union-attr]
        system.launch("triage", "hello")
        system.run_until_idle()
        narrow = CliRunner().invoke(app, ["versions", "--database-url", url], env={"COLUMNS": "80"})
        monkeypatch.delenv("COLUMNS", raising=False)  # pytest-xdist's workers set it
        piped = CliRunner().invoke(app, ["versions", "--database-url", url])
    assert narrow.exit_code == 0, narrow.output
    assert "…" not in narrow.output
    assert max(len(line) for line in narrow.output.splitlines()) <= 80
    (row,) = [line for line in piped.output.splitlines() if version in line]
    assert worker_id in row and "scan, status" in row
