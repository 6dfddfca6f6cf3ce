"""``MemoryLimiter``: the ``Limiter`` of one process (``LocalSystem``), the Redis scripts'
algorithm (``stores/redis_limiter.py``) under a lock; ``limiter.py`` says what it does."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dormant.rate_limit import ProviderLimits, RateLimit
from dormant.runtime.limiter import (
    AWAKE_GRACE_S,
    CONCURRENCY_SPACING_S,
    COUNTERS,
    NEXT_DUE_MOST,
    PLACE_EARLY_S,
    PLACE_KEPT_S,
    SLOT_POLL_S,
    TURN_KEPT_S,
    USAGE_WEIGHT,
    WAKE_AHEAD_S,
    Ask,
)

__all__ = ["MemoryLimiter"]


@dataclass
class _Bucket:
    requests: float
    tokens: float
    paced_requests: float
    paced_tokens: float
    """The background pace: refilled at ``1 - reserve`` of each rate."""
    at_s: float
    blocked_until_s: float = 0.0
    slots: dict[str, float] = field(default_factory=dict)
    """Slot id to its lease's expiry."""
    tails: dict[str, float] = field(default_factory=dict)
    """Flow to the time its queue's last place ends."""
    places: dict[str, float] = field(default_factory=dict)
    """Holder to the time of its place: its reservation."""
    parked: dict[str, float] = field(default_factory=dict)
    """The places nobody wakes yet (``place``), holder to its time."""
    turns: dict[str, float] = field(default_factory=dict)
    """Refused user text (interactive holders) to the time of its turn."""
    turns_tail: float = 0.0
    """When the last turn given to user text ends."""
    used_tokens: float = 0.0
    """Running mean of the tokens a call used (0: none seen yet)."""


@dataclass
class _Line:
    """Where a line (an agent and flow) queues: recorded by its last refused ask."""

    bucket: str
    limit: RateLimit
    tokens: int
    flow: str
    weight: float
    until_s: float


class MemoryLimiter:
    """``Limiter`` for one process (``LocalSystem``): the Redis script's algorithm under a
    lock, on a monotonic ``clock``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}
        self._lines: dict[str, _Line] = {}
        self._counters = dict.fromkeys(COUNTERS, 0.0)

    def acquire(self, bucket: str, limit: RateLimit, ask: Ask) -> float:
        with self._lock:
            now = self._clock()
            state = self._refilled(bucket, limit, now)
            background = bool(ask.holder) and not ask.interactive
            user = bool(ask.holder) and ask.interactive
            # a background holder's place, or user text's turn
            held = state.places if background else state.turns if user else {}
            place = held.get(ask.holder)
            state.parked.pop(ask.holder, None)  # it asks: whoever runs it wakes it now
            if place is not None and place - now > PLACE_EARLY_S:  # early: keep the place
                self._counters["refused"] += 1
                return place - now
            before = now + PLACE_EARLY_S if place is None else place
            if ask.interactive:  # after the user text told a turn before it, no one else
                turns = state.turns.values()
                ahead = len(state.turns) if place is None else sum(t < before for t in turns)
            else:  # after the places due before it, and every user text waiting its turn
                ahead = sum(p < before for p in state.places.values()) + len(state.turns)
            wait_s = _wait_s(state, limit, ask, now, ahead)
            if wait_s < 0.001:  # as Redis answers: in whole milliseconds
                state.places.pop(ask.holder, None)
                state.turns.pop(ask.holder, None)
                if limit.rpm:
                    state.requests -= 1
                if limit.tpm:
                    state.tokens -= ask.tokens
                if not ask.interactive:
                    state.paced_requests -= 1
                    state.paced_tokens -= _spaced_tokens(ask.tokens, state.used_tokens)
                if limit.concurrency:
                    state.slots[ask.slot] = now + ask.slot_ttl_s
                self._counters["admitted"] += 1
                return 0.0
            if place is None and not ask.interactive:
                wait_s = _queued_wait_s(state, limit, ask, now, wait_s)
                if background:
                    state.places[ask.holder] = now + wait_s
            elif place is None and user:  # its turn: after the user text refused before it
                start = max(now + wait_s, state.turns_tail)
                state.turns_tail = start + _spacing_s(limit, ask.tokens, state.used_tokens)
                state.turns[ask.holder] = start
                wait_s = start - now
            if background and ask.line:
                until_s = now + wait_s + PLACE_KEPT_S
                found = _Line(bucket, limit, ask.tokens, ask.flow, ask.weight, until_s)
                self._lines[ask.line] = found
            self._counters["refused"] += 1
            return wait_s

    def place(self, line: str, holder: str) -> float | None:
        with self._lock:
            now = self._clock()
            found = self._lines.get(line)
            if found is None or found.until_s <= now:
                self._lines.pop(line, None)
                return None
            state = self._refilled(found.bucket, found.limit, now)
            if holder in state.places:  # a launch retried: it keeps its place
                return max(0.001, state.places[holder] - now)
            if len(state.places) <= len(state.parked):
                return None  # no one ahead will be admitted to wake it
            ask = Ask(found.tokens, "", 0.0, False, found.flow, found.weight, holder, line)
            ahead = sum(p < now + PLACE_EARLY_S for p in state.places.values())
            wait_s = _wait_s(state, found.limit, ask, now, ahead + len(state.turns))
            if wait_s < 0.001 and state.tails.get(found.flow, 0.0) <= now:
                return None  # no queue: it would be admitted now
            wait_s = max(0.001, _queued_wait_s(state, found.limit, ask, now, wait_s))
            state.places[holder] = state.parked[holder] = now + wait_s
            found.until_s = max(found.until_s, now + wait_s + PLACE_KEPT_S)
            self._counters["parked"] += 1
            return wait_s

    def next_due(self, bucket: str, limit: RateLimit, longest_s: float) -> list[tuple[str, float]]:
        with self._lock:
            now = self._clock()
            state = self._refilled(bucket, limit, now)
            # a turn's tokens: what calls have been using (unknown before the first answer)
            ask = Ask(int(state.used_tokens), "", 0.0)
            most = NEXT_DUE_MOST
            if limit.concurrency:  # no more than the free slots: a release wakes the rest
                usable = limit.concurrency - _reserved_slots(limit.concurrency, limit.reserve)
                most = min(most, usable - len(state.slots))
                limit = replace(limit, concurrency=None)
            due: list[tuple[str, float]] = []

            def awake(place: float) -> bool:  # someone ahead will ask, and wake the next
                since = now - AWAKE_GRACE_S
                found = state.places.items()
                return any(since < p < place and h not in state.parked for h, p in found)

            for holder, place in sorted(state.parked.items(), key=lambda kv: kv[1]):
                if len(due) >= most:
                    break
                ahead = sum(p < place for p in state.places.values()) + len(state.turns)
                wait_s = max(place - now, _wait_s(state, limit, ask, now, ahead), 0.0)
                if wait_s > longest_s or (wait_s > WAKE_AHEAD_S and (due or awake(place))):
                    break
                due.append((holder, wait_s))
            for holder, _ in due:
                del state.parked[holder]
            return due

    def release(
        self,
        bucket: str,
        limit: RateLimit,
        slot: str,
        correction_tokens: float = 0.0,
        used_tokens: float = 0.0,
    ) -> None:
        with self._lock:
            state = self._refilled(bucket, limit, self._clock())
            state.slots.pop(slot, None)
            if limit.tpm:
                state.tokens = min(limit.tpm, state.tokens + correction_tokens)
            if used_tokens > 0:
                mean = state.used_tokens or used_tokens
                state.used_tokens = mean + USAGE_WEIGHT * (used_tokens - mean)

    def renew_slot(self, bucket: str, slot: str, ttl_s: float) -> bool:
        with self._lock:
            state = self._buckets.get(bucket)
            now = self._clock()
            if state is None or state.slots.get(slot, now) <= now:
                return False
            state.slots[slot] = now + ttl_s
            return True

    def feedback(self, bucket: str, limit: RateLimit, said: ProviderLimits) -> None:
        with self._lock:
            now = self._clock()
            state = self._refilled(bucket, limit, now)
            if said.retry_after_s is not None:  # a 429: blocked, refilled from its time on
                state.blocked_until_s = max(state.blocked_until_s, now + said.retry_after_s)
                # at its Retry-After the refused request passes: one request then, not none;
                # a limit the provider said has room was not what refused it
                if limit.rpm and not _has_room(said.requests_remaining):
                    state.requests = min(limit.rpm, 1.0)
                if not _has_room(said.tokens_remaining):
                    state.tokens = min(state.tokens, 0.0)
                state.paced_requests = min(state.paced_requests, 0.0)
                state.paced_tokens = min(state.paced_tokens, 0.0)
                state.at_s = max(state.at_s, state.blocked_until_s)
                return  # what remains now is no cap at the Retry-After, when it has refilled
            # "remaining" caps the bucket, which then refills at its rate. The reset is not
            # a wait: OpenAI's and Anthropic's both say when the limit is *fully*
            # replenished, and a provider that counts a 60 s window says a minute after
            # every call while it frees capacity call by call (blocking until then stalled
            # a burst for a minute after each 429); the wait is the 429's Retry-After.
            if said.requests_remaining is not None and limit.rpm:
                state.requests = min(state.requests, said.requests_remaining)
            if said.tokens_remaining is not None and limit.tpm:
                state.tokens = min(state.tokens, said.tokens_remaining)

    def count(self, counter: str, amount: float = 1.0) -> None:
        with self._lock:
            self._counters[counter] = self._counters.get(counter, 0.0) + amount

    def counters(self) -> dict[str, float]:
        with self._lock:
            return dict(self._counters)

    def _refilled(self, bucket: str, limit: RateLimit, now: float) -> _Bucket:
        state = self._buckets.get(bucket)
        if state is None:
            state = self._buckets[bucket] = _Bucket(
                limit.rpm or 0.0, limit.tpm or 0.0, limit.paced_requests, limit.paced_tokens, now
            )
        if now > state.at_s:  # after a 429, refilling starts only at the provider's time
            elapsed_s = now - state.at_s
            paced_s = elapsed_s * limit.paced_share
            if limit.rpm:
                state.requests = min(limit.rpm, state.requests + elapsed_s * limit.rpm / 60)
                refilled = state.paced_requests + paced_s * limit.rpm / 60
                state.paced_requests = min(limit.paced_requests, refilled)
            if limit.tpm:
                state.tokens = min(limit.tpm, state.tokens + elapsed_s * limit.tpm / 60)
                refilled = state.paced_tokens + paced_s * limit.tpm / 60
                state.paced_tokens = min(limit.paced_tokens, refilled)
            state.at_s = now
        state.slots = {slot: until for slot, until in state.slots.items() if until > now}
        state.tails = {flow: tail for flow, tail in state.tails.items() if tail > now}
        state.places = {
            holder: place for holder, place in state.places.items() if place > now - PLACE_KEPT_S
        }
        state.parked = {
            holder: place for holder, place in state.parked.items() if holder in state.places
        }
        state.turns = {holder: at for holder, at in state.turns.items() if at > now - TURN_KEPT_S}
        return state


def _wait_s(state: _Bucket, limit: RateLimit, ask: Ask, now: float, ahead: int) -> float:
    """0 if every limit admits ``ask`` now, after the ``ahead`` places due before it, else
    the longest of their waits."""
    share = 0.0 if ask.interactive else limit.reserve
    wait_s = max(0.0, state.blocked_until_s - now)
    # After a 429 the levels refill only from the provider's time: every ask is told that
    # much more, so the threads it blocked come back in their turns, not all at once.
    refill_s = max(0.0, state.at_s - now)
    if limit.rpm:
        need = min(limit.rpm, 1 + math.ceil(limit.rpm * share) + ahead)
        if state.requests < need:
            wait_s = max(wait_s, refill_s + (need - state.requests) * 60 / limit.rpm)
        if not ask.interactive and state.paced_requests < 1:  # its turn: after those ahead
            paced_rpm = limit.rpm * limit.paced_share
            owed = 1 + ahead - state.paced_requests
            wait_s = max(wait_s, refill_s + owed * 60 / paced_rpm)
    if limit.tpm:
        spaced = _spaced_tokens(ask.tokens, state.used_tokens)
        need = min(limit.tpm, ask.tokens + limit.tpm * share + ahead * spaced)
        if state.tokens < need:
            wait_s = max(wait_s, refill_s + (need - state.tokens) * 60 / limit.tpm)
        paced = min(spaced, limit.paced_tokens)
        if not ask.interactive and state.paced_tokens < paced:
            paced_tpm = limit.tpm * limit.paced_share
            owed = paced + ahead * paced - state.paced_tokens
            wait_s = max(wait_s, refill_s + owed * 60 / paced_tpm)
    if limit.concurrency:
        usable = limit.concurrency - _reserved_slots(limit.concurrency, share)
        if len(state.slots) >= usable:
            wait_s = max(wait_s, min(SLOT_POLL_S, min(state.slots.values()) - now))
    return wait_s


def _has_room(remaining: float | None) -> bool:
    """Whether a 429 said a limit still had room (a request, a token): not what refused it."""
    return remaining is not None and remaining >= 1


def _spaced_tokens(tokens: int, used_tokens: float) -> float:
    """A call's tokens as places and the pace count them: what calls have been using
    (``used_tokens``), once known, not the upper-bound estimate. A background call may
    leave the pace in debt: it is admitted when the pace holds that much, or is full."""
    return min(tokens, used_tokens or tokens)


def _reserved_slots(concurrency: int, share: float) -> int:
    """Slots background work leaves free: its share, at least one (of two or more)."""
    if share <= 0:
        return 0
    return min(concurrency - 1, max(1, math.floor(concurrency * share)))


def _queued_wait_s(state: _Bucket, limit: RateLimit, ask: Ask, now: float, wait_s: float) -> float:
    """A refused background ask's place in its flow's queue: after the flow's last place,
    spaced by the bucket's rate times the flows waiting over the flow's weight."""
    waiting = len(state.tails) + (0 if ask.flow in state.tails else 1)
    start = max(now + wait_s, state.tails.get(ask.flow, 0.0))
    spacing_s = _spacing_s(limit, ask.tokens, state.used_tokens) / limit.paced_share
    state.tails[ask.flow] = start + spacing_s * waiting / ask.weight
    return start - now


def _spacing_s(limit: RateLimit, tokens: int, used_tokens: float) -> float:
    """The time the bucket takes to afford one more such request at the full rate (places
    are spaced at the paced rate: this over ``paced_share``): a call's tokens are what
    calls have been using (``used_tokens``), once known, not the upper bound."""
    spacing = 0.0
    if limit.rpm:
        spacing = 60 / limit.rpm
    if limit.tpm:
        spacing = max(spacing, _spaced_tokens(tokens, used_tokens) * 60 / limit.tpm)
    if spacing == 0 and limit.concurrency:
        spacing = CONCURRENCY_SPACING_S / limit.concurrency
    return spacing
