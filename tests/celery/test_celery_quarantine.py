"""A poison message is quarantined by real workers while the thread's next message is
processed; ``retry`` puts it back."""

from __future__ import annotations

from collections.abc import Callable

from conftest import Deployment, wait_until

from dormant.messages import AssistantTurn, UserText
from dormant.stores.base import InboxState, ThreadStatus


def test_a_poison_message_is_quarantined_while_the_next_message_is_processed(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_QUARANTINE_AFTER_FAILURES="3", DORMANT_STALL_AFTER_FAILURES="5")
    worker = d.start_worker("w1", concurrency=2)
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    thread_id = client.launch("picky", "a poison pill")
    client.send(thread_id, "a fine question", message_id="fine")

    wait_until(
        lambda: AssistantTurn(text="read: a fine question") in client.history(thread_id),
        60,
        "the message after the poison one to be answered",
        check=d.check_alive,
        poll_s=0.1,
    )
    (row,) = client.store.inbox(thread_id, InboxState.QUARANTINED)
    assert row.message_id == f"launch:{thread_id}"
    assert "quarantined after 3 failed slices: KeyError: 'choices'" in row.reason
    users = [i.text for i in client.history(thread_id) if isinstance(i, UserText)]
    assert users == ["a fine question"]
    assert client.thread(thread_id).status is ThreadStatus.IDLE
    # The quarantining slice task ended as a FAILURE naming the message (Flower's
    # exception column) and said so in the worker's log.
    wait_until(
        lambda: "goes on without a poison message" in worker.log_path.read_text(errors="replace"),
        30,
        "the worker to report the quarantine",
        poll_s=0.2,
    )
    assert (
        f"message 'launch:{thread_id}' quarantined after 3 failed slices"
        in worker.log_path.read_text(errors="replace")
    )
