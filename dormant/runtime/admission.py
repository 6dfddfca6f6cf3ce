"""Admission control around a slice's model call: ask before, correct after, never sleep.

``complete_admitted`` replaces the slice's plain ``complete_with_retry``. For a model with
a ``RateLimit`` (on the model, or ``Settings.rate_limits`` by model name or base URL) it
asks the ``Limiter`` first; a refusal, or a 429 from the provider, raises ``Throttled``
instead of sleeping in the worker slot: the slice ends without consuming anything, the
thread's "not before" time is set (``defer``: the failure backoff's ``retry_at``, no failure
counted) and it is woken at its place (a Celery worker retries the slice then, for a short
wait; the sweeper otherwise). A 429's ``Retry-After`` and rate-limit headers drain the
shared bucket until their reset, and the call asks again at once: refused, it is told its
turn (user text among the user text refused before it, background its place), not the
block's end with every thread the block refused. A completion's usage corrects the token
estimate. A successful answer's ``remaining``/``reset`` headers are not fed back: they were
read when its stream began, seconds stale by its end, and a provider that enforces its
minute over a second says "none remaining" after nearly every call, which would hold the
bucket far below the rate it was configured with while the provider answers every call. Other
retryable failures (a 5xx, a dropped stream) are retried in the slot as before, each retry
admitted again.

An admitted call wakes the threads parked behind it (``Limiter.next_due``: launches that
took their place without a slice, ``park``) with a countdown to each one's turn
(``SliceDeps.wake_in``), so a parked thread runs one slice, the one that calls its model.

A model without a limit keeps today's retry-with-sleep (``complete_with_retry``); its 429s
(``rate_limited``) and the seconds slept (``asleep_s``) are counted, so a deployment sees
what its slots spend asleep.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from dormant.errors import ModelRetryable, Throttled
from dormant.models.base import ChunkSink, Completion, Model, ModelRequest
from dormant.models.retry import backoff_s, complete_with_retry
from dormant.rate_limit import ProviderLimits, RateLimit
from dormant.runtime.deps import SliceDeps
from dormant.runtime.lease_keeper import keeper
from dormant.runtime.limiter import PLACE_KEPT_S, THROTTLED_S, Ask, Limiter
from dormant.runtime.outcomes import Deferred
from dormant.settings import Settings
from dormant.stores.base import Store

__all__ = [
    "PARKED_LAG",
    "PLACE_BACKSTOP_S",
    "PLACE_WAKE_EARLY_S",
    "Caller",
    "complete_admitted",
    "defer",
    "estimate_tokens",
    "flow_of",
    "limit_for",
    "line_of",
    "next_deferred",
    "park",
]

log = logging.getLogger("dormant.admission")

PLACE_WAKE_EARLY_S = 30.0
"""A deferral longer than twice this is stored this much earlier: the sweeper (whose wakes
come a sweep interval late, in batches) then wakes the thread before its place, the limiter
answers the rest of the wait, and the worker waits that as a short countdown, so the thread
asks on time, one at a time, instead of with the sweep's batch."""
PLACE_BACKSTOP_S = 10.0
"""A deferred thread that whoever runs its slices wakes at its place itself
(``SliceDeps.wakes_at_place_s``: a Celery worker retries the slice with that countdown) is
stored as not before this long after its place: the sweeper wakes it then only if that
wake was lost (the worker holding the countdown's task died), and it still claims its
place, which is kept ``PLACE_KEPT_S``. Stored at its place, the sweeper woke it there too:
a second slice task whenever the countdown's slice had not yet taken the lease."""
assert PLACE_BACKSTOP_S < PLACE_KEPT_S
PARKED_LAG = 0.1
"""How far behind its places a long queue may fall, as a share of the wait (429s, user
text taking the reserve, busy workers: the burst of issue 23 ran at 92 % of the limit
against places given at 95 %): a parked thread's stored "not before" adds this much of
its wait to ``PLACE_BACKSTOP_S``. At 10 s alone, the sweeper woke the last hundred
threads of a 500-thread queue before their turns, a refused slice each."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks: the thread, whether user text woke it, its flow (agent or tenant), and its
    line (``line_of``)."""

    thread_id: str
    interactive: bool
    flow: str
    weight: float = 1.0
    line: str = ""


def flow_of(agent: str, metadata: Mapping[str, Any]) -> str:
    """Whose queue a thread's background calls join: its tenant's, else its agent's."""
    return str(metadata.get("tenant") or agent)


def line_of(agent: str, flow: str) -> str:
    """The queue a background launch can join without a slice: its agent's in its flow
    (an agent, not its tenant alone: another agent of the tenant may use another model)."""
    return f"{agent}/{flow}"


def park(
    limiter: Limiter, agent: str, metadata: Mapping[str, Any] | None, thread_id: str
) -> datetime | None:
    """A background launch's place in its line's queue, taken without a slice
    (``Limiter.place``): its stored "not before", a little after that place (whoever is
    admitted before it wakes it in its turn; the sweeper there if that wake is lost); None
    when it should be woken now (issue 35: a slice before its place is only refused)."""
    now = datetime.now(UTC)
    wait_s = limiter.place(line_of(agent, flow_of(agent, metadata or {})), thread_id)
    if wait_s is None:
        return None
    return now + timedelta(seconds=wait_s * (1 + PARKED_LAG) + PLACE_BACKSTOP_S)


def limit_for(model: Model, settings: Settings) -> tuple[str, RateLimit] | None:
    """The bucket and limit of ``model``: ``Settings.rate_limits`` by its name, then by its
    base URL, then the model's own ``rate_limit``; None when it has none."""
    base_url = getattr(model, "base_url", None)
    endpoint = base_url.rstrip("/") if isinstance(base_url, str) else None
    for key, limit in settings.rate_limits:
        if key == model.name or (endpoint is not None and key.rstrip("/") == endpoint):
            return (limit.bucket or key, limit) if limit.limited else None
    own = getattr(model, "rate_limit", None)
    if isinstance(own, RateLimit) and own.limited:
        return own.bucket or f"{model.name}@{endpoint or 'default'}", own
    return None


def estimate_tokens(request: ModelRequest, limit: RateLimit) -> int:
    """A quarter of the request's characters (instructions, items as JSON, tool schemas)
    plus the most it may answer (``max_tokens``, else ``RateLimit.output_tokens``)."""
    chars = len(request.instructions)
    for item in request.items:
        chars += len(item.model_dump_json())
    for spec in request.tools:
        chars += len(spec.name) + len(spec.description) + len(str(spec.parameters))
    output = request.settings.max_tokens or limit.output_tokens
    return math.ceil(chars / 4) + output


def complete_admitted(
    deps: SliceDeps,
    caller: Caller,
    model: Model,
    request: ModelRequest,
    on_chunk: ChunkSink,
    between_attempts: Callable[[float], None] | None = None,
) -> Completion:
    """One completion, admitted by the limiter when the model has a limit (see the module
    docstring); raises ``Throttled`` when it must wait for capacity. ``between_attempts``
    (default ``deps.sleep``) waits out a retry's backoff: the slice's also starts a new
    attempt in its stream."""
    settings = deps.settings
    limiter = deps.limiter
    pause = _counted(between_attempts or deps.sleep, limiter)
    found = limit_for(model, settings) if limiter is not None else None
    if limiter is None or found is None:
        return complete_with_retry(
            _Counted(model, limiter) if limiter is not None else model,
            request,
            on_chunk,
            attempts=settings.model_attempts,
            base_s=settings.model_backoff_s,
            max_s=settings.model_backoff_max_s,
            sleep=pause,
        )
    bucket, limit = found
    estimate = estimate_tokens(request, limit)
    told = False
    for attempt in range(1, settings.model_attempts + 1):
        slot = uuid.uuid4().hex
        ask = Ask(
            estimate,
            slot,
            settings.lease_ttl_s,  # kept alive while the call runs, given back soon after a death
            caller.interactive,
            caller.flow,
            caller.weight,
            holder=caller.thread_id,
            line=caller.line,
        )
        wait_s = limiter.acquire(bucket, limit, ask)
        if wait_s > 0:
            raise Throttled(caller.thread_id, bucket, wait_s)
        _wake_next(deps, limiter, bucket, limit)
        try:
            with keeper.keep_alive(
                partial(limiter.renew_slot, bucket, slot),
                f"a concurrency slot of {bucket}",
                settings.lease_ttl_s,
                renew_for_s=request.settings.timeout_s,  # a hung call's slot then expires
            ):
                completion = model.complete(request, on_chunk)
        except ModelRetryable as error:
            limiter.release(bucket, limit, slot)
            said = error.limits or ProviderLimits()
            if error.status == 429:
                limiter.count("rate_limited")
                if said.retry_after_s is None:
                    said = replace(said, retry_after_s=THROTTLED_S)
            if said:
                limiter.feedback(bucket, limit, said)
            _wake_next(deps, limiter, bucket, limit)  # its slot is free again
            if error.status == 429 and not told and attempt < settings.model_attempts:
                told = True  # asks again once: refused until the block ends, told its turn
                continue
            if error.status == 429:
                wait_s = said.retry_after_s or THROTTLED_S
                raise Throttled(caller.thread_id, bucket, wait_s) from error
            if attempt == settings.model_attempts:
                raise
            pause_s = backoff_s(attempt, settings.model_backoff_s, settings.model_backoff_max_s)
            pause(pause_s)
            continue
        except BaseException:
            limiter.release(bucket, limit, slot)
            raise
        used = completion.usage.total_tokens
        limiter.release(bucket, limit, slot, estimate - used if used else 0.0, used)
        _wake_next(deps, limiter, bucket, limit)  # its slot is free again
        return completion
    raise AssertionError("unreachable: model_attempts must be >= 1")


def _wake_next(deps: SliceDeps, limiter: Limiter, bucket: str, limit: RateLimit) -> None:
    """Admitted, or its call ended (a concurrency slot free again): wake the parked threads
    whose turns come next, each with a countdown to its turn. A wake that fails is left to
    the sweeper (the thread's stored "not before")."""
    if deps.wake_in is None:
        return
    for thread_id, wait_s in limiter.next_due(bucket, limit, deps.wakes_at_place_s):
        try:
            deps.wake_in(thread_id, wait_s)
        except Exception:
            log.warning("waking parked %s failed; the sweeper will", thread_id, exc_info=True)


class _Counted:
    """A model whose 429s are counted (``rate_limited``) on their way to the retry loop."""

    def __init__(self, model: Model, limiter: Limiter) -> None:
        self.name = model.name
        self.context_window = model.context_window
        self._model = model
        self._limiter = limiter

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        try:
            return self._model.complete(request, on_chunk)
        except ModelRetryable as error:
            if error.status == 429:
                self._limiter.count("rate_limited")
            raise


def _counted(sleep: Callable[[float], None], limiter: Limiter | None) -> Callable[[float], None]:
    """``sleep``, adding the seconds to the limiter's ``asleep_s``."""
    if limiter is None:
        return sleep

    def counted(seconds: float) -> None:
        limiter.count("asleep_s", seconds)
        sleep(seconds)

    return counted


def defer(deps: SliceDeps, throttled: Throttled, seen: int) -> Deferred:
    """End the slice for want of capacity: the thread's messages stay queued, and the
    sweeper leaves it alone until its "not before" time (no failure is counted): its place,
    ``PLACE_WAKE_EARLY_S`` before a distant one, or ``PLACE_BACKSTOP_S`` after one that
    whoever runs the slices wakes it at (``SliceDeps.wakes_at_place_s``). ``seen``, the
    newest inbox row the slice looked at, tells the sweeper which user text was asked for
    (it waits for its turn) and which came after (woken at once, ``Store.defer``)."""
    wait_s = throttled.wait_s
    not_before = deps.clock() + timedelta(seconds=wait_s)
    if wait_s <= deps.wakes_at_place_s:
        stored_s = PLACE_BACKSTOP_S  # the runner wakes it on time; the sweeper if that is lost
    else:
        stored_s = -PLACE_WAKE_EARLY_S if wait_s > 2 * PLACE_WAKE_EARLY_S else 0.0
    deps.store.defer(throttled.thread_id, not_before + timedelta(seconds=stored_s), seen=seen)
    if deps.limiter is not None:
        deps.limiter.count("deferred")
    log.debug(
        "thread %s deferred %.2f s: no capacity in %s",
        throttled.thread_id,
        throttled.wait_s,
        throttled.bucket,
    )
    return Deferred(throttled.thread_id, not_before, throttled.wait_s)


def next_deferred(store: Store, now: datetime, limit: int = 100) -> datetime | None:
    """The earliest "not before" of a thread deferred for capacity (queued messages, no
    failure, a ``retry_at`` after ``now``): what ``LocalSystem.run_until_idle`` waits for."""
    due: datetime | None = None
    for thread_id in store.threads_to_wake(limit):
        info = store.thread(thread_id)
        if info.failures == 0 and info.retry_at is not None and info.retry_at > now:
            due = info.retry_at if due is None else min(due, info.retry_at)
    return due
