"""The dedup fast path is asked only about ids a caller chose: a fresh id cannot be a
duplicate, so ``deliver``/``send`` without one skip a Redis round trip on the wake path."""

from __future__ import annotations

import pytest

from dormant import Agent, ToolContext, tool
from dormant.errors import DuplicateMessage
from dormant.models import SimulatedModel
from dormant.stores.memory.sync import MemoryDedup
from tests.harness import Harness


class CountingDedup(MemoryDedup):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def seen(self, thread_id: str, message_id: str) -> bool:
        self.asked.append(message_id)
        return super().seen(thread_id, message_id)


@tool(deferred=True)
def wait_build(target: str, ctx: ToolContext) -> None:
    """Start a build; its result is delivered later."""


def _client() -> tuple[Harness, CountingDedup]:
    model = SimulatedModel(call_every=1, tool="wait_build", tool_args={"target": "x"})
    client = Harness(Agent("a", model=model, tools=[wait_build]))
    client.dedup = dedup = CountingDedup()
    return client, dedup


def test_send_and_deliver_without_a_message_id_never_ask_the_dedup_set() -> None:
    client, dedup = _client()
    thread_id = client.launch("a", "hi")
    client.step(thread_id)
    (call_id,) = [row.call_id for row in client.outbox]
    client.run_tools()
    first = client.send(thread_id, "more")
    second = client.deliver(thread_id, call_id, "build green")
    assert dedup.asked == []
    assert first != second and first.startswith("msg_") and second.startswith("msg_")


def test_a_chosen_message_id_is_still_checked_and_refused_when_seen() -> None:
    client, dedup = _client()
    thread_id = client.launch("a", "hi")
    client.send(thread_id, "once", message_id="m1")
    dedup.add(thread_id, ["m1"])
    with pytest.raises(DuplicateMessage):
        client.send(thread_id, "again", message_id="m1")
    assert dedup.asked == ["m1", "m1"]
