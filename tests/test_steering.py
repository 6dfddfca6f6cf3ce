"""Steering: what user text does when it arrives while a slice of the thread is running."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from dormant import Agent
from dormant.agents import Steering
from dormant.errors import ThreadBusy
from dormant.messages import AssistantTurn, UserText
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.runtime.slice import Idle, Steered
from dormant.settings import Settings
from dormant.stores.base import InboxState
from tests.harness import Harness


@dataclass
class Streaming:
    """Streams three chunks; ``during`` runs after the first one (a user typing meanwhile)."""

    during: Callable[[], None] | None = None
    name: str = "streaming"
    context_window: int = 100_000
    seen: list[list[str]] = field(default_factory=list)

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        texts = [i.text for i in request.items if isinstance(i, UserText)]
        self.seen.append(texts)
        on_chunk("Thinking about ")
        if self.during is not None:
            during, self.during = self.during, None
            during()
        on_chunk(" ".join(texts))
        on_chunk(".")
        return Completion(text=f"Answer to: {' / '.join(texts)}")


def harness(steering: Steering, model: Streaming) -> Harness:
    settings = Settings(steer_check_s=0.0, model_backoff_s=0.0)
    return Harness(Agent("a", model=model, steering=steering), settings=settings)


def turns(h: Harness, t: str) -> list[str]:
    return [i.text for i in h.history(t) if isinstance(i, AssistantTurn)]


def test_enqueue_applies_text_sent_mid_completion_at_the_next_slice_boundary() -> None:
    model = Streaming()
    h = harness("enqueue", model)
    t = h.launch("a", "first")
    model.during = lambda: h.send(t, "second")
    assert isinstance(h.step(t), Idle)
    assert h.woken[-1] == t  # the slice saw the new row and asked for another slice
    h.step(t)
    assert turns(h, t) == ["Answer to: first", "Answer to: first / second"]


def test_interrupt_cancels_the_running_completion_and_discards_its_partial_output() -> None:
    model = Streaming()
    h = harness("interrupt", model)
    t = h.launch("a", "first")
    model.during = lambda: h.send(t, "no, do this instead")
    assert isinstance(h.step(t), Steered)
    assert h.history(t) == []  # nothing of the cancelled completion was stored
    assert [r.state for r in h.store.inbox(t)] == [InboxState.PENDING, InboxState.PENDING]
    assert h.woken[-1] == t
    assert isinstance(h.step(t), Idle)
    assert turns(h, t) == ["Answer to: first / no, do this instead"]
    assert model.seen == [["first"], ["first", "no, do this instead"]]


def test_interrupt_is_not_triggered_by_results_or_events() -> None:
    model = Streaming()
    h = harness("interrupt", model)
    t = h.launch("a", "first")
    other = h.launch("a", "elsewhere")
    model.during = lambda: h.send(other, "not for this thread")
    assert isinstance(h.step(t), Idle)


def test_reject_refuses_text_while_a_slice_runs_and_stores_nothing() -> None:
    model = Streaming()
    h = harness("reject", model)
    t = h.launch("a", "first")
    refused: list[str] = []

    def meanwhile() -> None:
        with pytest.raises(ThreadBusy, match=t) as caught:
            h.send(t, "are you done yet?")
        refused.append(str(caught.value))

    model.during = meanwhile
    assert isinstance(h.step(t), Idle)
    assert refused and "busy" in refused[0]
    assert [r.message.text for r in h.store.inbox(t)] == ["first"]  # type: ignore[union-attr]
    h.send(t, "now it is free")  # accepted once the slice has ended
    assert len(h.store.inbox(t)) == 2
