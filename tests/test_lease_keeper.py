"""The lease keeper (``runtime/lease_keeper.py``): a slice keeps its thread's lease however
long its model takes without streaming, a slice that dies or runs past its deadline stops
being renewed so its thread is re-driven a lease's time-to-live later, and a refused
renewal stops the slice at its next step."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from dormant import Agent, Settings
from dormant.errors import CrashPoint
from dormant.models import ScriptedModel, reply
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.rate_limit import RateLimit
from dormant.runtime.lease_keeper import LeaseKeeper
from dormant.runtime.limiter import Ask
from dormant.runtime.memory_limiter import MemoryLimiter
from dormant.runtime.slice import Busy, Idle, SliceOutcome
from dormant.stores.memory.sync import MemoryLease
from tests.harness import Harness, poll

TTL_S = 0.3


def _holds_for(lease: MemoryLease, thread_id: str, for_s: float) -> None:
    """The lease stays held, looked at every 10 ms, for ``for_s`` (several TTLs)."""
    until = time.monotonic() + for_s
    while time.monotonic() < until:
        assert lease.held(thread_id), "the lease expired while its slice ran"
        time.sleep(0.01)


class _Silent:
    """A model that says nothing until let go: a reasoning model thinking."""

    name = "silent"
    context_window = 100_000

    def __init__(self) -> None:
        self.started = threading.Event()
        self.go = threading.Event()
        self.calls = 0

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        self.calls += 1
        self.started.set()
        assert self.go.wait(30)
        return reply("thought it through")


def _in_background(run: Callable[[], SliceOutcome]) -> tuple[threading.Thread, list[object]]:
    ended: list[object] = []

    def target() -> None:
        try:
            ended.append(run())
        except BaseException as error:
            ended.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, ended


def test_a_slice_keeps_its_lease_through_a_silent_model_request_longer_than_the_lease() -> None:
    model = _Silent()
    h = Harness(Agent("thinker", model=model), settings=Settings(lease_ttl_s=TTL_S))
    t = h.launch("thinker", "think hard")
    worker, ended = _in_background(lambda: h.step(t))
    assert model.started.wait(10)

    _holds_for(h.lease, t, 6 * TTL_S)  # before the keeper: expired after one TTL
    assert isinstance(h.step(t), Busy)  # a second wake finds it held

    model.go.set()
    worker.join(10)
    assert isinstance(ended[0], Idle), ended
    assert model.calls == 1
    assert h.history(t)[-1].text == "thought it through"  # type: ignore[union-attr]
    assert not h.lease.held(t)


def test_a_model_call_longer_than_the_lease_keeps_its_concurrency_slot() -> None:
    """A concurrency slot is a lease of ``lease_ttl_s``, so a worker that dies mid-call gives
    it back that soon (it was the request's whole timeout, 120 s, plus the TTL); a live
    call keeps it however long it runs, and gives it back when it ends."""
    model = _Silent()
    limit = RateLimit(concurrency=1, reserve=0.0)
    settings = Settings(lease_ttl_s=TTL_S, rate_limits=((model.name, limit),))
    h = Harness(Agent("thinker", model=model), settings=settings)
    limiter = MemoryLimiter()
    h.deps = replace(h.deps, limiter=limiter)
    t = h.launch("thinker", "think hard")
    worker, ended = _in_background(lambda: h.step(t))
    assert model.started.wait(10)

    other = Ask(1, "other", TTL_S, interactive=True)
    until = time.monotonic() + 6 * TTL_S
    while time.monotonic() < until:  # before: the slot, held 120 s + TTL, was never renewed
        assert limiter.acquire(model.name, limit, other) > 0, "the slot lapsed mid-call"
        time.sleep(0.01)

    model.go.set()
    worker.join(10)
    assert isinstance(ended[0], Idle), ended
    assert limiter.acquire(model.name, limit, other) == 0  # given back at the call's end


def test_a_dead_callers_concurrency_slot_lapses_after_the_lease_ttl() -> None:
    """What a slot is asked for with: the lease's TTL, not the request's timeout."""
    model = _Silent()
    limit = RateLimit(concurrency=1, reserve=0.0)
    settings = Settings(lease_ttl_s=TTL_S, rate_limits=((model.name, limit),))
    h = Harness(Agent("thinker", model=model), settings=settings)
    asks: list[Ask] = []

    class Recording(MemoryLimiter):
        def acquire(self, bucket: str, limit: RateLimit, ask: Ask) -> float:
            asks.append(ask)
            return super().acquire(bucket, limit, ask)

    h.deps = replace(h.deps, limiter=Recording())
    model.go.set()
    t = h.launch("thinker", "think")
    assert isinstance(h.step(t), Idle)
    assert [ask.slot_ttl_s for ask in asks] == [TTL_S]


def test_a_slice_that_dies_stops_being_renewed_and_its_thread_runs_again() -> None:
    h = Harness(
        Agent("echo", model=ScriptedModel(lambda items: reply("hi"))),
        settings=Settings(lease_ttl_s=TTL_S, crash_points=frozenset({"holding_lease"})),
    )
    t = h.launch("echo", "hello")
    with pytest.raises(CrashPoint):
        h.step(t)
    assert h.lease.held(t)  # a dead holder's lease stays until it expires, unrenewed
    poll(lambda: not h.lease.held(t), timeout_s=5 * TTL_S)
    h.deps = replace(h.deps, settings=Settings(lease_ttl_s=TTL_S))  # the next worker lives
    assert isinstance(h.step(t), Idle)
    assert h.history(t)[-1].text == "hi"  # type: ignore[union-attr]


def test_a_slice_past_its_deadline_is_renewed_no_more() -> None:
    lease = MemoryLease()
    keeper = LeaseKeeper()
    token = lease.acquire("thr_1", TTL_S)
    assert token is not None
    with keeper.keep(lease, "thr_1", token, TTL_S, renew_for_s=2 * TTL_S) as hold:
        poll(lambda: hold.renewals >= 2)
        poll(lambda: not lease.held("thr_1"), timeout_s=10 * TTL_S)  # hung: let go
        renewals = hold.renewals
        assert not hold.lost
    assert renewals <= 6


def test_a_refused_renewal_marks_the_hold_lost() -> None:
    lease = MemoryLease()
    keeper = LeaseKeeper()
    token = lease.acquire("thr_1", TTL_S)
    assert token is not None
    with keeper.keep(lease, "thr_1", token, TTL_S, renew_for_s=None) as hold:
        poll(lambda: hold.renewals >= 1)
        lease.revoke("thr_1")  # what closing the thread does
        poll(lambda: hold.lost)
        assert lease.acquire("thr_1", TTL_S) is not None  # another holder may have it now


def test_many_holds_are_renewed_by_one_thread_each_on_its_own_time() -> None:
    lease = MemoryLease()
    keeper = LeaseKeeper()
    before = threading.active_count()
    ttls = {f"thr_{n}": TTL_S * (1 + n % 3) for n in range(20)}
    tokens = {t: lease.acquire(t, ttl) for t, ttl in ttls.items()}
    with contextlib.ExitStack() as stack:
        holds = [
            stack.enter_context(keeper.keep(lease, t, tokens[t] or "", ttl, None))
            for t, ttl in ttls.items()
        ]
        assert threading.active_count() == before + 1
        poll(lambda: all(h.renewals >= 2 for h in holds))
        assert all(lease.held(t) for t in ttls)
