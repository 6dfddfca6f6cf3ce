"""A launch or send whose wake fails after the commit is not a failure, and a launch with a
chosen thread id is safe to run again (the broker-down retry that made second threads)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event

from dormant import Agent, LocalSystem
from dormant.errors import CrashPoint, MessageRejected
from dormant.models import ScriptedModel, reply
from dormant.stores.base import NewThread
from dormant.stores.sql.store import SQLStore

AGENT = Agent("calc", model=ScriptedModel(lambda items: reply("ok")))
OTHER = Agent("other", model=ScriptedModel(lambda items: reply("ok")))


class BrokerDown(LocalSystem):
    """A runtime whose wakes fail, as ``Client``'s do when the broker is unreachable."""

    failure: BaseException = ConnectionError("Error 111 connecting to 127.0.0.1:1")

    def wake(self, thread_id: str, priority: int) -> None:
        raise self.failure


@pytest.fixture
def down() -> Iterator[BrokerDown]:
    system = BrokerDown([AGENT, OTHER], "memory://")
    yield system
    system.close()


def test_a_failed_wake_after_the_commit_returns_the_id_and_logs_a_warning(
    down: BrokerDown, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="dormant.client"):
        thread_id = down.launch("calc", "hi")
        message_id = down.send(thread_id, "more", message_id="m-1")

    assert message_id == "m-1"
    assert [r.message_id for r in down.store.inbox(thread_id)] == [f"launch:{thread_id}", "m-1"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all("the sweeper will wake it" in w for w in warnings)
    assert thread_id in warnings[0] and "ConnectionError" in warnings[0]


def test_a_crash_point_in_a_wake_is_not_swallowed(down: BrokerDown) -> None:
    down.failure = CrashPoint("after_commit")
    with pytest.raises(CrashPoint):
        down.launch("calc", "hi")


def test_launching_a_chosen_thread_id_again_creates_nothing(down: BrokerDown) -> None:
    assert down.launch("calc", "hi", thread_id="thr_1") == "thr_1"
    assert down.launch("calc", "hi", thread_id="thr_1") == "thr_1"

    with pytest.raises(MessageRejected, match="'thr_1' was already launched"):
        down.launch("calc", "other text", thread_id="thr_1")
    with pytest.raises(MessageRejected, match="exists already, for agent 'calc'"):
        down.launch("other", "hi", thread_id="thr_1")
    assert [t.id for t in down.threads()] == ["thr_1"]
    assert len(down.store.inbox("thr_1")) == 1


def test_a_launch_retried_after_the_thread_but_before_its_message_completes_it() -> None:
    with LocalSystem([AGENT], "memory://") as system:
        system.store.create_thread(NewThread(id="thr_half", agent="calc"))  # then a crash
        assert system.launch("calc", "hi", thread_id="thr_half") == "thr_half"
        system.run_until_idle()
        assert [r.message_id for r in system.store.inbox("thr_half")] == ["launch:thr_half"]
        assert len(system.history("thr_half")) == 2  # the text and the reply


def test_a_database_error_inside_a_launch_leaves_no_thread_and_a_retry_launches_it(
    tmp_path: Path,
) -> None:
    """The thread and its first message are one transaction: no thread without its message."""
    with LocalSystem([AGENT], f"sqlite:///{tmp_path / 'launch.db'}") as system:
        store = system.store
        assert isinstance(store, SQLStore)
        failures = ["INSERT INTO inbox"]

        def fail_once(conn: object, cursor: object, statement: str, *args: object) -> None:
            if failures and statement.startswith(failures[0]):
                failures.clear()
                raise RuntimeError("the database went away between the two writes")

        event.listen(store._engine, "before_cursor_execute", fail_once)
        with pytest.raises(RuntimeError, match="went away"):
            system.launch("calc", "hi", thread_id="thr_torn")
        assert system.threads() == []  # not a thread without its message

        assert system.launch("calc", "hi", thread_id="thr_torn") == "thr_torn"
        system.run_until_idle()
        assert [r.message_id for r in store.inbox("thr_torn")] == ["launch:thr_torn"]
        assert len(system.history("thr_torn")) == 2
