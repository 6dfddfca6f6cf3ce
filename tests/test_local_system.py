"""LocalSystem: the embedded runtime with its thread pool, sweeper and SQLite file."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.errors import UnknownAgent
from dormant.messages import AssistantTurn, Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.settings import Settings
from dormant.stores.base import ThreadStatus

callbacks: dict[str, str] = {}
release = threading.Event()


@tool(deferred=True)
def start_job(name: str, ctx: ToolContext) -> None:
    """Start a long job; it calls back when done."""
    callbacks[name] = ctx.callback_url


@tool
def slow_lookup(key: str) -> str:
    """A lookup that blocks until the test releases it."""
    assert release.wait(timeout=10)
    return f"{key}=42"


def script(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText) and last.text.startswith("job"):
        return reply("starting", call("start_job", name=last.text))
    if isinstance(last, UserText) and last.text.startswith("nap"):
        when = (datetime.now(UTC) + timedelta(seconds=30)).isoformat()
        return reply("napping", call("sleep_until", iso_time=when))
    if isinstance(last, UserText) and last.text.startswith("look"):
        return reply("looking", call("slow_lookup", key="k"))
    if isinstance(last, ToolResult):
        return reply(f"done: {last.content}")
    return reply("hello")


AGENT = Agent("worker", model=ScriptedModel(script), tools=[start_job, slow_lookup])


def final_text(system: LocalSystem, thread_id: str) -> str:
    last = system.history(thread_id)[-1]
    assert isinstance(last, AssistantTurn)
    return last.text


def test_many_threads_run_concurrently_to_completion_in_memory() -> None:
    with LocalSystem([AGENT], "memory://", workers=4) as system:
        ids = [system.launch("worker", f"hi {n}") for n in range(50)]
        system.run_until_idle()
        assert all(final_text(system, t) == "hello" for t in ids)
        assert system.slices_run == 50


def test_a_deferred_result_survives_a_restart_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/agents.db"
    settings = Settings(database_url=url, secret_keys=("k1",))
    with LocalSystem([AGENT], url, settings=settings) as system:
        thread_id = system.launch("worker", "job-7")
        system.run_until_idle()
        assert system.thread(thread_id).status is ThreadStatus.WAITING
    with LocalSystem([AGENT], url, settings=settings) as system:  # a new process
        system.deliver_callback(callbacks["job-7"], "finished")
        system.run_until_idle()
        assert final_text(system, thread_id) == "done: finished"


def test_a_timer_due_while_the_process_was_down_fires_after_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/agents.db"
    with LocalSystem([AGENT], url) as system:
        thread_id = system.launch("worker", "nap")
        system.run_until_idle()
        due = system.store.next_timer_due()
        assert due is not None
    # The timer comes due while no process runs: pretend 31 seconds passed.
    with LocalSystem([AGENT], url) as system:
        fired = system.store.fire_due_timers(due + timedelta(seconds=1))
        assert [r.thread_id for r in fired] == [thread_id]
        system.run_until_idle()
        assert final_text(system, thread_id).startswith("done: Woke up at the target time")


def test_close_waits_for_a_running_tool_and_its_result_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The result comes back while the system closes: it is stored, the log says the next
    system runs it (there is no sweeper to wake it), and the next system does."""
    url = f"sqlite:///{tmp_path}/agents.db"
    release.clear()
    system = LocalSystem([AGENT], url)
    thread_id = system.launch("worker", "look it up")
    closer = threading.Thread(target=system.close)
    deadline = datetime.now(UTC) + timedelta(seconds=10)
    while not any(c.name == "slow_lookup" for c in system.store.load(thread_id).calls.values()):
        assert datetime.now(UTC) < deadline, "the tool never started"
    closer.start()
    while not system._stop.is_set():  # closing: its pool takes no more work
        assert datetime.now(UTC) < deadline, "close never began"
    release.set()
    closer.join(timeout=10)
    said = [r.getMessage() for r in caplog.records if r.name == "dormant.local"]
    assert said == [
        f"thread {thread_id} has work left as its LocalSystem closes; "
        "a LocalSystem opening the same database runs it"
    ]
    with LocalSystem([AGENT], url) as again:
        again.run_until_idle()
        assert final_text(again, thread_id) == "done: k=42"


def test_launching_an_unknown_agent_names_the_known_ones() -> None:
    with LocalSystem([AGENT], "memory://") as system, pytest.raises(UnknownAgent, match="worker"):
        system.launch("nobody", "hi")


def test_a_model_calling_a_tool_its_agent_lacks_gets_errors_and_the_system_stays_live() -> None:
    broken = Agent(
        "broken", model=ScriptedModel(lambda items: reply("", call("start_job", name="x")))
    )
    with LocalSystem([broken], "memory://") as system:
        thread_id = system.launch("broken", "go")
        # It calls the missing tool for ever: slice after slice, until its budget says stop.
        report = system.run_until_idle(raise_on_failure=False)
        result = next(i for i in system.history(thread_id) if isinstance(i, ToolResult))
        assert result.is_error and "does not exist" in result.content
        (failed,) = report.failed
        assert "budget: max_completions_per_message 50/50" in failed.error
        assert system.thread(thread_id).status is ThreadStatus.STALLED


def test_many_threads_with_tools_run_concurrently_on_a_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/busy.db"
    callbacks.clear()
    with LocalSystem([AGENT], url, workers=4) as system:
        ids = [system.launch("worker", f"job-{n}") for n in range(30)]
        system.run_until_idle(timeout_s=60)
        assert all(system.thread(t).status is ThreadStatus.WAITING for t in ids)
        for name, callback in list(callbacks.items()):
            system.deliver_callback(callback, f"{name} finished")
        system.run_until_idle(timeout_s=60)
        assert sorted(final_text(system, t) for t in ids) == sorted(
            f"done: job-{n} finished" for n in range(30)
        )


def test_the_sweeper_outlives_a_store_that_fails_between_sweeps(tmp_path: Path) -> None:
    """The sweeper thread asks the store when the next timer is due between sweeps; an
    outage there (a database briefly unreachable) used to end the thread for good, so no
    timer of the process fired again."""

    def nap(items: Sequence[Item]) -> Completion:
        if isinstance(items[-1], UserText):
            return reply("napping", call("sleep", seconds=0.3))
        return reply("rested")

    settings = Settings(secret_keys=("k",), sweep_interval_s=0.1)
    napper = Agent("napper", model=ScriptedModel(nap))
    url = f"sqlite:///{tmp_path}/sweeper.db"  # a file of the test's own, not the checkout's
    with LocalSystem([napper], url, settings=settings) as system:
        failures = [ConnectionError("database unreachable")]
        next_due = system.store.next_timer_due

        def flaky_next_due() -> datetime | None:
            if failures:
                raise failures.pop()
            return next_due()

        system.store.next_timer_due = flaky_next_due  # type: ignore[method-assign]
        thread_id = system.launch("napper", "take a nap")
        deadline = time.monotonic() + 20
        while "rested" not in [getattr(i, "text", None) for i in system.history(thread_id)]:
            assert time.monotonic() < deadline, "the timer never fired: the sweeper died"
            time.sleep(0.05)  # polling for the sweeper's work, with a deadline
        assert not failures, "the store never failed: the test tested nothing"
