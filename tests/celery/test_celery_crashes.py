"""Real deaths: a worker SIGKILLed at each crash point, then a fresh worker finishes the job.

Every crash point runs on Redis as broker; on RabbitMQ, a death mid-slice and one inside a
tool, with the default visibility timeout: there nothing but RabbitMQ's redelivery of a
dead consumer's unacknowledged task brings the tool back within the test's deadline.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable

import pytest
from conftest import Deployment, wait_until

from dormant.client import Client
from dormant.messages import AssistantTurn, ToolResult, UserText
from dormant.stores.base import InboxState

THREADS = 4
POINTS = ["holding_lease", "after_model", "before_commit", "after_commit", "in_tool"]
CASES = [*(("redis", point) for point in POINTS), ("amqp", "before_commit"), ("amqp", "in_tool")]


def _finished(client: Client, thread_id: str) -> bool:
    history = client.history(thread_id)
    return bool(history) and history[-1] == AssistantTurn(text="done: 5")


@pytest.mark.parametrize(("broker", "point"), CASES)
def test_a_worker_killed_at_a_crash_point_loses_and_duplicates_nothing(
    deploy: Callable[..., Deployment], broker: str, point: str
) -> None:
    # Redis hands a dead worker's tasks on after the visibility timeout (4 s here); RabbitMQ
    # at once, so there the default (an hour) keeps the sweeper's lost-task re-dispatch out.
    visibility_timeout_s = "4" if broker == "redis" else "3600"
    d = deploy(
        broker,
        DORMANT_LEASE_TTL_S="2",
        DORMANT_VISIBILITY_TIMEOUT_S=visibility_timeout_s,
        DORMANT_OUTBOX_GRACE_S="1",
    )
    doomed = d.start_worker("doomed", env={"DORMANT_CRASH_POINTS": point})
    d.expected_deaths.add("doomed")
    d.start_beat()
    client = d.client()
    thread_ids = [client.launch("calc", "go") for _ in range(THREADS)]

    wait_until(lambda: not doomed.alive(), 30, f"the worker to die at {point}", check=d.check_alive)
    assert doomed.popen.returncode == -signal.SIGKILL, doomed.log()
    survivor = d.start_worker("survivor")
    d.wait_ready(survivor)
    wait_until(
        lambda: all(_finished(client, t) for t in thread_ids),
        45,
        "every thread to finish on the new worker",
        check=d.check_alive,
        poll_s=0.2,
    )

    for thread_id in thread_ids:
        stored = client.stored_history(thread_id)
        items = [s.item for s in stored]
        assert [i.kind for i in items] == ["user", "assistant", "tool_result", "assistant"]
        assert items[0] == UserText(text="go")
        assert isinstance(items[1], AssistantTurn) and items[1].text == "adding"
        results = Counter(i.call_id for i in items if isinstance(i, ToolResult))
        assert results == Counter({items[1].calls[0].call_id: 1}), "each call has one result"
        assert isinstance(items[2], ToolResult) and items[2].content == "5"
        assert len({s.message_id for s in stored}) == len(stored)
        assert client.thread(thread_id).status == "idle"
        assert all(r.state is InboxState.DONE for r in client.store.inbox(thread_id))
