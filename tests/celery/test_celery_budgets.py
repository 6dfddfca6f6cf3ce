"""A looping agent on real workers stops at its budget with the reason visible, and
``raise_budget`` resumes it until the new limit."""

from __future__ import annotations

from collections.abc import Callable

from conftest import Deployment, wait_until

from dormant.messages import AssistantTurn
from dormant.stores.base import ThreadStatus


def test_a_looping_agent_stalls_at_its_budget_and_resumes_after_raise_budget(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy()
    worker = d.start_worker("w1", concurrency=2)
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    thread_id = client.launch("looper", "count for ever")

    def stalled() -> bool:
        return client.thread(thread_id).status is ThreadStatus.STALLED

    wait_until(stalled, 60, "the looping agent to stop at its budget", check=d.check_alive)
    info = client.thread(thread_id)
    assert info.last_error.startswith("budget: max_tokens 330/330"), info.last_error
    turns = sum(isinstance(i, AssistantTurn) for i in client.history(thread_id))
    assert turns == 3  # 110 tokens a completion
    assert client.store.usage(thread_id=thread_id)["looper"].completions == 3
    # The slice task that stopped it ended as a FAILURE naming the budget (Flower).
    wait_until(
        lambda: "budget: max_tokens 330/330" in worker.log_path.read_text(errors="replace"),
        30,
        "the worker to report the stop",
        poll_s=0.2,
    )

    client.raise_budget(thread_id, max_tokens=660)
    wait_until(
        lambda: stalled() and "660/660" in client.thread(thread_id).last_error,
        60,
        "the agent to run again and stop at the new limit",
        check=d.check_alive,
    )
    turns = sum(isinstance(i, AssistantTurn) for i in client.history(thread_id))
    assert turns == 6
    assert client.thread(thread_id).tree_tokens == 660
