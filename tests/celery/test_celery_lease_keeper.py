"""On real workers, a slice keeps its thread's lease however long its model says nothing
(``runtime/lease_keeper.py``): with a 1 s lease and a model silent for 3 s, a message sent
meanwhile wakes a slice on the other worker that finds the lease held, and is answered by
the holder after its commit. Before the keeper, the lease expired mid-request, the second
slice ran a completion of its own beside the first, and the thread's completions overlapped;
and a worker killed in a silent request is re-driven a lease's time-to-live later, its
model's concurrency slot free again as soon."""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import pairwise

from conftest import Deployment, wait_until

from dormant.messages import AssistantTurn, UserText


def _intervals(d: Deployment, thread_id: str) -> list[tuple[float, float]]:
    raw = d.redis.lrange(d.key("intervals", thread_id), 0, -1)
    return sorted((float(s), float(e)) for s, e, _pid in (r.split() for r in raw))


def _thinking(d: Deployment, thread_id: str) -> None:
    """Wait until the thread's model has begun its silence."""
    wait_until(
        lambda: d.redis.llen(d.key("thinking", thread_id)) == 1,
        60,
        "the model to start thinking",
        check=d.check_alive,
    )


def _slot_expiry_s(d: Deployment) -> float:
    """When the one concurrency slot of the ``recorded`` model lapses (Redis's clock)."""
    ((_slot, expires_ms),) = d.redis.zrange(
        f"{d.prefix}:limit:recorded:slots", 0, -1, withscores=True
    )
    return float(expires_ms) / 1000


def _slot_left_s(d: Deployment) -> float:
    seconds, micros = d.redis.time()
    return _slot_expiry_s(d) - (seconds + micros / 1e6)


def test_a_model_silent_for_longer_than_the_lease_runs_alone_while_wakes_arrive(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_LEASE_TTL_S="1")
    workers = [d.start_worker("w1", concurrency=2), d.start_worker("w2", concurrency=2)]
    d.start_beat()
    d.wait_ready(*workers)
    client = d.client()
    thread_id = client.launch("thinker", "first")
    _thinking(d, thread_id)
    client.send(thread_id, "second")  # wakes a slice while the first is silent

    def answered_both() -> bool:
        history = client.history(thread_id)
        users = [i.text for i in history if isinstance(i, UserText)]
        return users == ["first", "second"] and history[-1] == AssistantTurn(text="seen 2")

    wait_until(answered_both, 60, "both messages to be answered", check=d.check_alive)
    intervals = _intervals(d, thread_id)
    for (_, end), (start, _) in pairwise(intervals):
        assert start >= end, f"two completions of the thread overlapped: {intervals}"
    assert len(intervals) == 2, intervals  # one a message: the held lease turned none away
    assert "LeaseLost" not in d.logs()


def test_a_worker_killed_in_a_silent_request_is_redriven_after_the_lease(
    deploy: Callable[..., Deployment],
) -> None:
    """The model allows one call at a time: the dead worker's concurrency slot must lapse
    with its lease, or the re-driven slice is refused until the request's timeout (120 s)."""
    one_at_a_time = {"recorded": {"concurrency": 1, "reserve": 0}}
    d = deploy(DORMANT_LEASE_TTL_S="1", DORMANT_RATE_LIMITS=json.dumps(one_at_a_time))
    doomed = d.start_worker("w1", concurrency=1)
    d.expected_deaths.add("w1")
    d.start_beat()
    d.wait_ready(doomed)
    client = d.client()
    thread_id = client.launch("thinker", "first")
    _thinking(d, thread_id)
    assert _slot_left_s(d) <= 1.5  # the slot is a lease of the lease's TTL, not 121 s
    first = _slot_expiry_s(d)
    wait_until(lambda: _slot_expiry_s(d) > first, 10, "the live call to renew its slot")
    doomed.kill()
    wait_until(lambda: _slot_left_s(d) <= 0, 10, "the dead worker's slot to lapse")
    survivor = d.start_worker("w2", concurrency=1)
    d.wait_ready(survivor)
    wait_until(
        lambda: client.history(thread_id)[-1:] == [AssistantTurn(text="seen 1")],
        60,
        "the sweeper to re-drive the dead worker's thread",
        check=d.check_alive,
    )
    assert d.redis.llen(d.key("thinking", thread_id)) == 2  # asked again, once
