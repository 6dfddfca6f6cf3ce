"""A failed completion consumes nothing: Celery retries the slice, and a thread that keeps
failing is stalled with its error visible instead of retried forever."""

from __future__ import annotations

from collections.abc import Callable

from conftest import Deployment, wait_until

from dormant.messages import AssistantTurn
from dormant.stores.base import InboxState, ThreadStatus


def test_a_failed_completion_is_retried_and_a_hopeless_thread_stalls(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_MODEL_ATTEMPTS="1")  # one attempt a slice: Celery retries the slice
    worker = d.start_worker("w1", concurrency=4)
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    flaky = client.launch("flaky", "hello")
    broken = client.launch("broken", "hello")

    wait_until(
        lambda: client.history(flaky)[-1:] == [AssistantTurn(text="answered on call 2")],
        30,
        "the retried slice to answer",
        check=d.check_alive,
        poll_s=0.1,
    )
    assert [i.kind for i in client.history(flaky)] == ["user", "assistant"]

    wait_until(
        lambda: client.thread(broken).status is ThreadStatus.STALLED,
        30,
        "the hopeless thread to stall",
        check=d.check_alive,
        poll_s=0.1,
    )
    info = client.thread(broken)
    assert "ModelFatal: provider refused call 1" in info.last_error
    assert info.failures == 1  # a provider refusing the key stalls at once, not after 5 tries
    assert int(d.redis.get(d.key("calls", broken)) or 0) == 1
    assert client.history(broken) == []  # the user text was not consumed by a failure...
    assert [r.state for r in client.store.inbox(broken)] == [InboxState.PENDING]  # ...kept


def test_a_model_raising_a_plain_exception_stalls_its_thread_with_the_error(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_STALL_AFTER_FAILURES="3")
    worker = d.start_worker("w1", concurrency=2)
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    buggy = client.launch("buggy", "hello")

    wait_until(
        lambda: client.thread(buggy).status is ThreadStatus.STALLED,
        60,
        "the thread whose model raises KeyError to stall",
        check=d.check_alive,
        poll_s=0.1,
    )
    info = client.thread(buggy)
    assert (info.failures, info.last_error) == (3, "KeyError: 'choices'")
    assert int(d.redis.get(d.key("calls", buggy)) or 0) == 3  # three tries, not a spin
    assert [r.state for r in client.store.inbox(buggy)] == [InboxState.PENDING]
