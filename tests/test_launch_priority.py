"""``launch(priority=...)``: a launch no person waits on queues behind user text (issue 23).

The Celery queues are tested on a real worker in tests/celery/test_celery_launch_priority.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest

from dormant import Agent, Client, LocalSystem, Settings, tool
from dormant.errors import ConfigurationError
from dormant.messages import Item, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.stores.base import Priority
from dormant.stores.memory.store import MemoryStore
from dormant.stores.memory.sync import MemoryDedup
from dormant.stores.sql.store import SQLStore
from tests.harness import Harness
from tests.test_cli_errors import empty_dir, migrated, run

if TYPE_CHECKING:
    from dormant.stores.redis import RedisEvents

__all__ = ["empty_dir", "migrated"]  # the CLI cases' fixtures, shared with test_cli_errors

hold_started = threading.Event()
hold_release = threading.Event()
completions: list[str] = []


@tool
def hold() -> str:
    """Occupy the one pool thread until the test lets go."""
    hold_started.set()
    assert hold_release.wait(timeout=60)
    return "held"


def _script(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText) and last.text == "hold":
        return reply("holding", call("hold"))
    return reply("ok")


class _Recording(ScriptedModel):
    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        completions.append(request.thread_id)
        return super().complete(request, on_chunk)


AGENT = Agent("a", model=_Recording(_script), tools=[hold])


class _Wakes(Harness):
    def __init__(self, *agents: Agent) -> None:
        super().__init__(*agents)
        self.wakes: list[tuple[str, int]] = []

    def wake(self, thread_id: str, priority: int) -> bool:
        self.wakes.append((thread_id, priority))
        return True


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, Priority.INTERACTIVE),
        ({"priority": "interactive"}, Priority.INTERACTIVE),
        ({"priority": "background"}, Priority.BACKGROUND),
        ({"priority": Priority.BACKGROUND}, Priority.BACKGROUND),
    ],
)
def test_a_launch_queues_and_wakes_its_first_message_at_its_priority(
    given: dict[str, object], expected: Priority
) -> None:
    h = _Wakes(AGENT)
    t = h.launch("a", "hi", **given)  # type: ignore[arg-type]
    assert h.wakes == [(t, expected)]
    (row,) = h.store.inbox(t)
    assert row.priority == expected


def test_a_retried_background_launch_wakes_its_thread_in_the_background_again() -> None:
    h = _Wakes(AGENT)
    t = h.launch("a", "hi", thread_id="thr_batch_1", priority="background")
    assert h.launch("a", "hi", thread_id=t, priority="background") == t
    assert h.wakes == [(t, Priority.BACKGROUND), (t, Priority.BACKGROUND)]


@pytest.mark.parametrize("wrong", ["urgent", "BACKGROUND", "", 8, None])
def test_an_unknown_priority_is_refused_before_anything_is_stored(wrong: object) -> None:
    h = _Wakes(AGENT)
    with pytest.raises(ConfigurationError, match="not one of 'interactive', 'background'"):
        h.launch("a", "hi", thread_id="thr_refused", priority=wrong)  # type: ignore[arg-type]
    assert h.threads() == []
    assert h.wakes == []


def test_local_system_runs_user_text_before_threads_launched_in_the_background() -> None:
    completions.clear()
    hold_started.clear()
    hold_release.clear()
    with LocalSystem([AGENT], "memory://", workers=1) as system:
        user = system.launch("a", "hello")
        system.run_until_idle(timeout_s=60)
        holder = system.launch("a", "hold")
        assert hold_started.wait(timeout=60)  # the one pool thread is busy in a tool now
        completions.clear()
        burst = [system.launch("a", f"webhook {n}", priority="background") for n in range(5)]
        system.send(user, "urgent")  # user text, sent after the burst
        hold_release.set()
        system.run_until_idle(timeout_s=60)
    assert completions[0] == user, completions
    assert sorted(completions[1:]) == sorted([*burst, holder])


def test_dormant_launch_takes_a_priority_and_refuses_an_unknown_one(
    empty_dir: Path, migrated: str
) -> None:
    launched = run(
        empty_dir,
        *("launch", "calc", "hi", "--thread-id", "thr_1", "--priority", "background"),
        DORMANT_DATABASE_URL=migrated,  # the broker is down: the thread is saved, not woken
    )
    assert launched.code == 0 and launched.out == "thr_1\n", launched.err
    wrong = run(
        empty_dir, "launch", "calc", "hi", "--priority", "urgent", DORMANT_DATABASE_URL=migrated
    )
    assert wrong.code == 2, wrong.err  # a usage error, checked as the command line is read
    assert "'urgent' is not a priority: use interactive or background" in wrong.err
    store = SQLStore(migrated)
    try:
        assert [t.id for t in store.threads()] == ["thr_1"]
        assert [r.priority for r in store.inbox("thr_1")] == [Priority.BACKGROUND]
    finally:
        store.close()


def test_launch_on_commit_keeps_its_priority_and_refuses_a_wrong_one_before_the_commit() -> None:
    hooks: list[Callable[[], object]] = []
    wakes: list[tuple[str, int]] = []

    def wake(thread_id: str, priority: int) -> bool:
        wakes.append((thread_id, priority))
        return True

    client = Client(
        MemoryStore(),
        MemoryDedup(),
        Settings().with_ephemeral_secret(),
        waker=wake,
        events=cast("RedisEvents", None),  # nothing here reads events
        on_commit=hooks.append,
    )
    with pytest.raises(ConfigurationError):
        client.launch_on_commit("a", "hi", priority="later")
    assert hooks == []  # refused in the caller's transaction, not after its commit
    t = client.launch_on_commit("a", "hi", priority="background")
    for hook in hooks:
        hook()  # the caller's transaction commits
    assert wakes == [(t, Priority.BACKGROUND)]
