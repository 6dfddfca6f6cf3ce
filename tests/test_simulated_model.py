"""SimulatedModel's text costs what real model output costs once stored."""

from __future__ import annotations

import zlib

from dormant import Agent, LocalSystem
from dormant.messages import AssistantTurn
from dormant.models import SimulatedModel
from dormant.models.simulated import simulated_text


def _ratio(text: str) -> float:
    raw = text.encode()
    return len(raw) / len(zlib.compress(raw, 6))


def test_a_whole_twenty_turn_thread_compresses_like_real_replies() -> None:
    for thread in ("t1", "t2", "t3"):
        whole = "\n".join(simulated_text(1200, 7, f"{thread}:{n}") for n in range(40))
        assert 2.5 <= _ratio(whole) <= 3.5


def test_text_depends_only_on_seed_and_key() -> None:
    assert simulated_text(1200, 7, "a:1") == simulated_text(1200, 7, "a:1")
    assert simulated_text(1200, 7, "a:1") != simulated_text(1200, 7, "a:2")
    assert simulated_text(1200, 7, "a:1") != simulated_text(1200, 8, "a:1")
    assert len(simulated_text(1200, 7, "a:1")) == 1200
    # Every key, not one: the text once came out a character short when its sentences
    # filled it exactly (the separators were counted once too often).
    assert {len(simulated_text(300, 0, f"k{n}")) for n in range(2000)} == {300}


def test_turns_of_a_thread_are_distinct_completions_of_the_set_size() -> None:
    agent = Agent("sim", model=SimulatedModel(completion_chars=300))
    with LocalSystem([agent], database_url="memory://") as system:
        thread_id = system.launch("sim", "first")
        system.run_until_idle()
        system.send(thread_id, "second")
        system.run_until_idle()
        turns = [i.text for i in system.history(thread_id) if isinstance(i, AssistantTurn)]
    assert len(turns) == 2
    assert turns[0] != turns[1]
    assert all(len(t) == 300 for t in turns)
