"""Model failures never consume input; leases and versions keep one slice per thread."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from dormant import Agent, LocalSystem
from dormant.errors import ModelFatal, ModelRetryable
from dormant.messages import AssistantTurn, Item, StatusChanged
from dormant.models import reply
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.runtime.slice import Busy, Failed, Idle, Stale, Stalled
from dormant.settings import Settings
from dormant.stores.base import InboxState, ThreadInfo, ThreadStatus
from dormant.stores.memory.store import MemoryStore
from tests.harness import Harness


@dataclass
class Flaky:
    """Fails ``failures`` times (retryable), then answers."""

    failures: int
    name: str = "flaky"
    context_window: int = 1000
    calls: int = 0

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        self.calls += 1
        if self.calls <= self.failures:
            on_chunk("partial text that must never be stored")
            raise ModelRetryable("HTTP 503 from provider", retry_after_s=None)
        return reply("answer")


def turns(items: Sequence[Item]) -> list[AssistantTurn]:
    return [i for i in items if isinstance(i, AssistantTurn)]


def settings(**overrides: object) -> Settings:
    return Settings(model_attempts=2, model_backoff_s=0.0, stall_after_failures=2).with_(
        **overrides
    )


def test_a_retried_stream_stores_one_clean_turn() -> None:
    model = Flaky(failures=1)
    h = Harness(Agent("a", model=model), settings=settings())
    t = h.launch("a", "hi")
    assert isinstance(h.step(t), Idle)
    assert [turn.text for turn in turns(h.history(t))] == ["answer"]


def test_exhausted_retries_commit_nothing_and_keep_the_message_queued() -> None:
    model = Flaky(failures=10)
    h = Harness(Agent("a", model=model), settings=settings())
    t = h.launch("a", "hi")
    outcome = h.step(t)
    assert isinstance(outcome, Failed) and not outcome.stalled
    assert "HTTP 503" in outcome.error
    assert h.history(t) == []
    assert [r.state for r in h.store.inbox(t)] == [InboxState.PENDING]


def test_a_thread_stalls_after_repeated_failed_slices_and_retry_redrives_it() -> None:
    model = Flaky(failures=4)
    h = Harness(Agent("a", model=model), settings=settings())
    t = h.launch("a", "hi")
    h.step(t)
    outcome = h.step(t)
    assert isinstance(outcome, Failed) and outcome.stalled
    info = h.thread(t)
    assert info.status is ThreadStatus.STALLED and "HTTP 503" in info.last_error
    assert any(isinstance(e, StatusChanged) and e.status == "stalled" for e in h.events(t))
    assert isinstance(h.step(t), Stalled)  # a stalled thread is not run
    assert h.store.threads_to_wake() == []  # nor re-woken by the sweeper
    h.retry(t)
    assert isinstance(h.step(t), Idle)
    assert [turn.text for turn in turns(h.history(t))] == ["answer"]
    assert h.thread(t).failures == 0


def test_a_fatal_model_error_is_not_retried_within_the_slice() -> None:
    class Broken:
        name, context_window, calls = "broken", 1000, 0

        def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
            self.calls += 1
            raise ModelFatal("HTTP 401: bad key")

    model = Broken()
    h = Harness(Agent("a", model=model), settings=settings(model_attempts=5))
    t = h.launch("a", "hi")
    assert isinstance(h.step(t), Failed)
    assert model.calls == 1


def test_a_second_slice_ends_at_once_while_the_lease_is_held() -> None:
    h = Harness(Agent("a", model=Flaky(0)))
    t = h.launch("a", "hi")
    token = h.lease.acquire(t, 60)
    assert token is not None
    assert isinstance(h.step(t), Busy)
    h.lease.release(t, token)
    assert isinstance(h.step(t), Idle)


def test_a_stale_lease_holder_commits_nothing() -> None:
    """Two slices read the same version (a lease expired under a slow holder): one wins."""
    slow_started: list[bool] = []
    h: Harness

    def script(items: Sequence[Item]) -> Completion:
        if not slow_started:
            slow_started.append(True)
            h.lease.expire_all()  # the slow holder's lease lapses ...
            assert isinstance(h.step(t), Idle)  # ... and another slice runs meanwhile
        return reply("answer")

    from dormant.models import ScriptedModel

    h = Harness(Agent("a", model=ScriptedModel(script)))
    t = h.launch("a", "hi")
    assert isinstance(h.step(t), Stale)
    assert [turn.text for turn in turns(h.history(t))] == ["answer"]
    assert [r.state for r in h.store.inbox(t)] == [InboxState.DONE]


def test_a_failed_slice_backs_off_exponentially_before_the_sweeper_retries() -> None:
    from datetime import timedelta

    model = Flaky(failures=10)
    h = Harness(
        Agent("a", model=model), settings=settings(failure_backoff_s=4.0, stall_after_failures=9)
    )
    t = h.launch("a", "hi")
    first = h.step(t)
    second = h.step(t)
    assert isinstance(first, Failed) and isinstance(second, Failed)
    assert first.retry_at is not None and second.retry_at is not None
    waited = [first.retry_at - h.thread(t).created_at, second.retry_at - h.thread(t).created_at]
    assert timedelta(seconds=3.5) < waited[0] < timedelta(seconds=5)
    assert timedelta(seconds=7.5) < waited[1] < timedelta(seconds=9)
    assert h.store.threads_to_wake(now=second.retry_at - timedelta(seconds=1)) == []
    assert h.store.threads_to_wake(now=second.retry_at) == [t]


def test_a_thread_whose_agent_this_worker_lacks_is_stalled_with_the_reason() -> None:
    h = Harness(Agent("a", model=Flaky(0)))
    t = h.launch("a", "hi")
    h.deps = replace_agents(h)
    outcome = h.step(t)
    assert isinstance(outcome, Failed) and outcome.stalled
    info = h.thread(t)
    assert info.status is ThreadStatus.STALLED
    assert "unknown agent 'a'" in info.last_error and "in this worker" in info.last_error
    assert [r.state for r in h.store.inbox(t)] == [InboxState.PENDING]


def replace_agents(h: Harness) -> object:
    from dataclasses import replace

    from dormant.agents import AgentRegistry

    return replace(h.deps, agents=AgentRegistry([Agent("other", model=Flaky(0))]))


class Crashing:
    """A provider adapter with a bug: it raises a plain ``KeyError``, not a ``ModelError``."""

    name, context_window = "crashing", 1000

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        self.calls += 1
        return {}["choices"]  # type: ignore[no-any-return]


def test_a_plain_exception_from_the_model_is_a_recorded_failure_that_stalls_the_thread() -> None:
    model = Crashing()
    h = Harness(Agent("a", model=model), settings=settings(failure_backoff_s=3.0))
    t = h.launch("a", "hi")
    first = h.step(t)
    assert isinstance(first, Failed) and not first.stalled
    assert first.error == "KeyError: 'choices'"
    info = h.thread(t)
    assert (info.status, info.failures, info.last_error) == ("idle", 1, "KeyError: 'choices'")
    assert info.retry_at is not None and info.retry_at > info.updated_at  # backoff, not a spin
    assert h.history(t) == [] and [r.state for r in h.store.inbox(t)] == [InboxState.PENDING]
    second = h.step(t)
    assert isinstance(second, Failed) and second.stalled
    assert h.thread(t).status is ThreadStatus.STALLED
    assert isinstance(h.step(t), Stalled)
    assert model.calls == 2


def test_an_exception_in_the_agents_own_code_fails_the_slice_visibly() -> None:
    """Not only the model: any exception between load and commit is a recorded failure."""
    from dormant import tool

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    def explode(*_: object) -> object:
        raise RuntimeError("agent bug in thread set-up")

    agent = Agent("a", model=Flaky(0), tools=[lookup])
    object.__setattr__(agent, "specs", explode)  # the agent's own code raises mid-slice
    h = Harness(agent, settings=settings())
    t = h.launch("a", "hi")
    outcome = h.step(t)
    assert isinstance(outcome, Failed)
    assert h.thread(t).last_error == "RuntimeError: agent bug in thread set-up"


def test_a_failure_that_cannot_be_recorded_propagates_logged_and_frees_the_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Unreachable(MemoryStore):
        def record_failure(self, *args: object, **kwargs: object) -> ThreadInfo:
            raise ConnectionError("database unreachable")

    h = Harness(Agent("a", model=Crashing()), settings=settings(), store=Unreachable())
    t = h.launch("a", "hi")
    with (
        caplog.at_level(logging.ERROR, logger="dormant.slice"),
        pytest.raises(ConnectionError, match="database unreachable"),
    ):
        h.step(t)
    assert any(t in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert not h.lease.held(t)  # the next wake runs, it does not find a phantom holder


def test_a_local_system_stalls_a_thread_whose_model_raises_a_plain_exception() -> None:
    model = Crashing()
    config = settings(failure_backoff_s=0.01, stall_after_failures=3, sweep_interval_s=0.05)
    with LocalSystem([Agent("a", model=model)], "memory://", settings=config) as system:
        t = system.launch("a", "hi")
        deadline = time.monotonic() + 60
        while system.thread(t).status is not ThreadStatus.STALLED:
            assert time.monotonic() < deadline, f"not stalled: {system.thread(t)}"
            system.run_until_idle(timeout_s=60, raise_on_failure=False)  # a crash still raises
        info = system.thread(t)
        assert (info.status, info.failures) == (ThreadStatus.STALLED, 3)
        assert info.last_error == "KeyError: 'choices'"
        assert model.calls == 3  # three tries with backoff, then nothing more
        system.run_until_idle(timeout_s=60, raise_on_failure=False)
        assert model.calls == 3


def test_retry_jitter_leaves_the_applications_random_alone() -> None:
    """Backoff draws from dormant's own stream: a program that seeded ``random`` to repeat a
    run (or Hypothesis, checking nothing else draws while it generates data) sees no draw
    from a worker thread's retries."""
    random.seed(35)
    state = random.getstate()
    sleeps: list[float] = []
    model = Flaky(failures=1)
    h = Harness(Agent("a", model=model), settings=settings(model_backoff_s=0.01))
    h.deps = replace(h.deps, sleep=sleeps.append)
    t = h.launch("a", "hi")
    assert isinstance(h.step(t), Idle)
    assert len(sleeps) == 1 and 0.005 <= sleeps[0] <= 0.01  # it did back off, with jitter
    assert random.getstate() == state
