"""A burst launched as background on a real worker: user text sent after it runs first
(issue 23). Without ``priority="background"`` the burst would share the interactive queue
and the user's slice would be the last of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from conftest import Deployment, wait_until

from dormant import Agent
from dormant.messages import Item
from dormant.models import ScriptedModel, reply
from dormant.models.base import Completion
from dormant.runtime.slice import Idle
from tests.harness import Harness

BURST = 12


def _hello(items: Sequence[Item]) -> Completion:
    return reply("hello")


def _started_at(d: Deployment, thread_id: str) -> float | None:
    """When the worker's ``echo`` model started its (first) completion for the thread."""
    intervals = d.redis.lrange(d.key("intervals", thread_id), 0, 0)
    return float(intervals[0].split()[0]) if intervals else None


def _all_started(d: Deployment, threads: list[str]) -> list[float] | None:
    starts = [_started_at(d, t) for t in threads]
    return [s for s in starts if s is not None] if None not in starts else None


def test_user_text_runs_before_a_burst_launched_in_the_background_on_a_worker(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy()
    client = d.client()
    # The user's thread already exists: its first slice runs here, against the
    # deployment's database, so nothing of it is queued.
    driver = Harness(Agent("echo", model=ScriptedModel(_hello)), store=client.store)
    user = driver.launch("echo", "hi")
    assert isinstance(driver.step(user), Idle)

    burst = [client.launch("echo", f"webhook {n}", priority="background") for n in range(BURST)]
    client.send(user, "urgent: where is my order?")
    worker = d.start_worker("w1", concurrency=1)  # one slot: the queue order is the run order
    d.wait_ready(worker)

    starts = wait_until(
        lambda: _all_started(d, [user, *burst]),
        120,
        "every thread's completion",
        check=d.check_alive,
    )
    user_start, burst_starts = starts[0], starts[1:]
    assert user_start < min(burst_starts), (user_start, sorted(burst_starts))
