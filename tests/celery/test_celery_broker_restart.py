"""A worker rides out its broker: Redis killed and restarted under the same worker
process; and a tool run that died with its worker is re-sent within the claim TTL,
not after the broker's visibility timeout."""

from __future__ import annotations

import signal
from collections.abc import Callable

from conftest import REDIS_URL, Deployment, wait_until

from chaos.services import OwnRedis
from dormant.client import Client
from dormant.messages import AssistantTurn, ToolResult


def _finished(client: Client, thread_id: str) -> bool:
    history = client.history(thread_id)
    return bool(history) and history[-1] == AssistantTurn(text="done: 5")


def _on_own_redis(deploy: Callable[..., Deployment], own: OwnRedis, **env: str) -> Deployment:
    """A deployment whose broker and dormant Redis are ``own``; the test's bookkeeping
    (ready marks) stays on the shared Redis, so it survives the faults."""
    return deploy(
        DORMANT_BROKER_URL=own.url,
        DORMANT_REDIS_URL=own.url,
        DORMANT_TEST_REDIS_URL=REDIS_URL,
        DORMANT_LEASE_TTL_S="3",
        **env,
    )


def test_a_worker_rides_out_a_broker_restart_with_slices_in_flight(
    deploy: Callable[..., Deployment], own_redis: OwnRedis
) -> None:
    d = _on_own_redis(deploy, own_redis, DORMANT_VISIBILITY_TIMEOUT_S="5")
    worker = d.start_worker("w1", concurrency=4)
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    before = [client.launch("slow_calc", "go") for _ in range(12)]
    wait_until(lambda: any(_finished(client, t) for t in before), 60, "the first threads to finish")
    own_redis.kill()  # slices and tools in flight lose their broker and their leases
    own_redis.start()

    after = [client.launch("calc", "go") for _ in range(4)]
    wait_until(
        lambda: all(_finished(client, t) for t in before + after),
        90,
        "every thread to finish on the same worker after the restart",
        check=d.check_alive,
        poll_s=0.2,
        detail=d.logs,
    )
    assert worker.alive(), worker.log()
    for thread_id in before + after:
        results = [i for i in client.history(thread_id) if isinstance(i, ToolResult)]
        assert len(results) == 1, client.history(thread_id)


def test_a_tool_run_killed_with_its_worker_is_resent_within_the_claim_ttl(
    deploy: Callable[..., Deployment],
) -> None:
    # The shipped visibility timeout (an hour): only the claim can bring the tool back. A
    # short lease too: on a slow machine the dying worker's slice may still hold the
    # thread's lease when the tool kills it, and the result's slice then waits for its TTL.
    d = deploy(DORMANT_TOOL_CLAIM_TTL_S="2", DORMANT_OUTBOX_GRACE_S="1", DORMANT_LEASE_TTL_S="3")
    assert d.settings.visibility_timeout_s >= 3600
    doomed = d.start_worker("doomed", env={"DORMANT_CRASH_POINTS": "in_tool"})
    d.expected_deaths.add("doomed")
    d.start_beat()
    client = d.client()
    thread_id = client.launch("calc", "go")
    wait_until(lambda: not doomed.alive(), 60, "the worker to die in the tool", check=d.check_alive)
    assert doomed.popen.returncode == -signal.SIGKILL, doomed.log()
    survivor = d.start_worker("survivor")
    d.wait_ready(survivor)
    wait_until(
        lambda: _finished(client, thread_id),
        45,
        "the tool to be re-sent and the thread to finish",
        check=d.check_alive,
        poll_s=0.2,
    )
    results = [i for i in client.history(thread_id) if isinstance(i, ToolResult)]
    assert [r.content for r in results] == ["5"]


def test_a_tool_that_kills_every_worker_it_runs_on_is_answered_after_its_last_run(
    deploy: Callable[..., Deployment],
) -> None:
    """Not re-run for ever: once ``tool_max_runs`` runs died, the next one answers the
    call with why, and the thread goes on."""
    d = deploy(
        DORMANT_TOOL_CLAIM_TTL_S="2",
        DORMANT_OUTBOX_GRACE_S="1",
        DORMANT_LEASE_TTL_S="3",
        DORMANT_TOOL_MAX_RUNS="2",
    )
    d.start_beat()
    client = d.client()
    thread_id = client.launch("calc", "go")
    for name in ("doomed1", "doomed2"):  # each run kills the worker it runs on
        doomed = d.start_worker(name, env={"DORMANT_CRASH_POINTS": "in_tool"})
        d.expected_deaths.add(name)
        wait_until(lambda w=doomed: not w.alive(), 60, f"{name} to die in the tool")
        assert doomed.popen.returncode == -signal.SIGKILL, doomed.log()
    last = d.start_worker("last", env={"DORMANT_CRASH_POINTS": "in_tool"})
    d.wait_ready(last)
    wait_until(
        lambda: len(client.history(thread_id)) == 4,  # user, call, result, answer
        45,
        "the third run to answer the call instead of running the tool",
        check=d.check_alive,
        poll_s=0.2,
    )
    (result,) = [i for i in client.history(thread_id) if isinstance(i, ToolResult)]
    assert result.is_error
    assert result.content == (
        "Error: the tool's 2 runs died before finishing (each lost its worker); not run again"
    )
    assert last.alive(), last.log()
    assert d.unran(client, thread_id) == []
