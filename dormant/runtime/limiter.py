"""``Limiter``: token buckets for model calls, and ``MemoryLimiter``, the in-process one.

A bucket holds three limits at once: requests per minute and tokens per minute (each a
bucket refilled continuously, full when first used or after a minute of quiet) and
concurrent calls (slots, each with a lease so a holder that dies gives its slot back after
``slot_ttl_s``; a live caller renews it, ``renew_slot``). One ``acquire`` refills, checks
all three and either takes a request, the estimated tokens and a slot, or takes nothing and
answers how long to wait.

Background work (not woken by user text) leaves ``RateLimit.reserve`` of every limit
unused, so user text is admitted at once during a burst; and it is paced: a second, small
bucket refilled at ``1 - reserve`` of each rate and holding ``RateLimit.burst_s`` seconds'
worth (``paced_requests``, ``paced_tokens``), which only background calls pay, so the
provider itself always has room for user text and never sees a burst of a minute's worth.
A refused background ask is given
a place in its flow's queue (its agent, or its tenant): each flow's refusals are spaced by
the bucket's rate times the number of flows waiting, divided by the flow's weight, so
capacity coming back is shared between agents instead of going to whichever launched the
most threads. A place is kept: the holder (its thread) asking again at or after its place
is next in line, before every later place and every background ask without one, and when
the bucket cannot pay for it and the places ahead of it yet (each call must still leave the
reserve), it keeps its place and is told when the bucket will have capacity for it, so a
thread woken on time is never sent to the back of the queue. Refused by the pace, it is
told to come back when the pace will have paid for the places ahead of it too, not for
itself alone: when the queue has fallen behind its places (a 429's block, user text using
the reserve), every due holder used to come back each time the pace refilled by one call,
and all but one were refused again (issue 35: about ten slice tasks a thread). Token
places are spaced by the tokens calls have been using (a running mean of the completions'
usage), not by the upper-bound estimate each call is admitted with. User text gets no place
in a flow's queue: refused (its reserve spent), it is told its **turn** among the user text
refused before it (spaced at the full rate, ``turns``), ahead of every background place;
while user text waits for its turn, background asks count it ahead of them, so background
never goes first. Refused together, five user texts used to be told the same wait, came
back together, and all but one were refused again (issue 35: user text's first token at
1.5 to 2 s where the provider allowed about 1.1 s).

A 429's ``Retry-After`` says when the refused call passes: the bucket is blocked until
then and holds, then, that one request (not none: user text waited a request more than
the provider asked), and the limits the provider said still have room (its
``x-ratelimit-remaining-*``) are not emptied; the background pace is emptied, so
background waits for its refill after the block and user text goes first.

A thread need not run a slice to get its place (issue 35: a refused slice was a task that
called no model, about one per thread of a burst). A refused background ask records its
**line** (its agent and flow) and the bucket it queues in; while that line has a queue, a
background launch of the same line takes its place without running (``place``) and is
**parked**: nobody wakes it yet. Whoever is admitted next, or ends a call, wakes the
parked holders whose turns come soon (``next_due``: each with the seconds to its turn), so
a parked thread runs one slice, at its turn. The store keeps each parked thread's "not
before" a little after its place, so the sweeper still wakes it if Redis or the waking
worker is lost. ``RedisLimiter`` (``stores/redis_limiter.py``) is the same algorithm in
Lua, shared by every worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dormant.rate_limit import ProviderLimits, RateLimit

__all__ = [
    "AWAKE_GRACE_S",
    "CONCURRENCY_SPACING_S",
    "COUNTERS",
    "NEXT_DUE_MOST",
    "PLACE_EARLY_S",
    "PLACE_KEPT_S",
    "SLOT_POLL_S",
    "THROTTLED_S",
    "TURN_KEPT_S",
    "USAGE_WEIGHT",
    "WAKE_AHEAD_S",
    "Ask",
    "Limiter",
]

SLOT_POLL_S = 1.0
"""A caller refused a concurrency slot tries again after at most this long: a slot comes
back when its holder ends, which no one can predict."""
CONCURRENCY_SPACING_S = 1.0
"""With only a concurrency limit, refused background asks are spaced by this over the
limit (a guess at one call's length: the queue needs some rate)."""
PLACE_EARLY_S = 0.05
"""A holder may come this early to its place (the worker's clock and timer against the
limiter's) and still be admitted on it."""
PLACE_KEPT_S = 60.0
"""A place not claimed this long after its time is forgotten: its thread went elsewhere."""
USAGE_WEIGHT = 0.2
"""How much each completion's usage moves the running mean that spaces token places."""
THROTTLED_S = 1.0
"""How long a 429 without ``Retry-After`` or reset headers drains the bucket."""
TURN_KEPT_S = 5.0
"""A user text's turn not claimed this long after its time is forgotten (its thread was
answered by another slice, or its worker died and the sweeper wakes it as a newcomer):
short, because every waiting turn holds back later user text and background work."""

WAKE_AHEAD_S = 2.0
"""An admitted ask wakes the parked holders whose turns come within this long (and the next
unless one awake ahead will, ``AWAKE_GRACE_S``): enough that a hand-off's latency
(publish, start, load) never makes a turn late at any rate, and few countdowns held by a
worker (three at 100 RPM)."""
NEXT_DUE_MOST = 64
"""The most parked holders one ``next_due`` wakes."""
AWAKE_GRACE_S = 5.0
"""A holder not parked (woken, or deferred to its place) is awake until this long after
its place: it will ask and wake the next, so the next parked one, its turn further than
``WAKE_AHEAD_S``, is left parked. Past it, the holder is presumed lost (its worker died,
user text answered it) and the next is woken anyway, so the chain never stalls on it."""

COUNTERS = ("admitted", "refused", "deferred", "parked", "rate_limited", "asleep_s")
"""What a limiter counts: asks admitted and refused, slices that ended for want of capacity
(deferred), launches given their place without a slice (parked), 429s the provider answered
(rate_limited), seconds worker slots slept in a retry backoff (asleep_s)."""


@dataclass(frozen=True, slots=True)
class Ask:
    """One model call asking for admission."""

    tokens: int
    """Estimated tokens of the request and its answer."""
    slot: str
    """A unique id for the concurrency slot it holds until ``release``."""
    slot_ttl_s: float
    interactive: bool = False
    """Woken by user text: may use the reserve, and is never queued behind a flow."""
    flow: str = ""
    """Whose queue a refused background ask joins (an agent, a tenant)."""
    weight: float = 1.0
    holder: str = ""
    """Who holds a refused ask's place (its thread): asking again on time claims it."""
    line: str = ""
    """Its agent and flow (``admission.line_of``): refused in the background, it records the
    bucket the line queues in, where launches of the line then take places (``place``)."""


class Limiter(Protocol):
    """Shared token buckets, by bucket name (an endpoint and key)."""

    def acquire(self, bucket: str, limit: RateLimit, ask: Ask) -> float:
        """0.0 when admitted (a request, the tokens and a slot were taken); else the
        seconds until the ask may be admitted, and nothing was taken."""
        ...

    def release(
        self,
        bucket: str,
        limit: RateLimit,
        slot: str,
        correction_tokens: float = 0.0,
        used_tokens: float = 0.0,
    ) -> None:
        """Give the slot back, and ``correction_tokens`` (estimate minus actual use;
        negative when the call used more) to the token bucket; ``used_tokens`` (the
        completion's usage, 0 if unknown) moves the mean that spaces token places."""
        ...

    def renew_slot(self, bucket: str, slot: str, ttl_s: float) -> bool:
        """Hold ``slot`` for ``ttl_s`` more seconds (a call still running: the process's
        lease keeper renews it); False when it is no longer held."""
        ...

    def feedback(self, bucket: str, limit: RateLimit, said: ProviderLimits) -> None:
        """What the provider said. A ``retry-after`` (a 429) blocks the bucket until then,
        when it holds the one request the provider will take (a limit it said has room is
        left alone) and refills from there, so the calls that follow come at the bucket's
        rate instead of in a burst the provider refuses again; otherwise ``remaining``
        caps the bucket (its reset, when the limit is full again, is no wait)."""
        ...

    def place(self, line: str, holder: str) -> float | None:
        """A place for ``holder`` in ``line``'s queue without asking (a background launch):
        None when the line has no queue, or no one ahead who will be admitted and wake it
        (nothing taken: run it now); else the seconds until its place, which it keeps, and
        it is parked: ``next_due`` wakes it."""
        ...

    def next_due(self, bucket: str, limit: RateLimit, longest_s: float) -> list[tuple[str, float]]:
        """What an admitted ask, or a call's end, wakes: the parked holders of ``bucket``
        whose turns come within ``WAKE_AHEAD_S``, and the first one unless a holder awake
        ahead of it will ask first (``AWAKE_GRACE_S``), none further than ``longest_s``
        and no more than the concurrency slots free (a slot given back asks again); each
        with the seconds until its turn, and parked no longer."""
        ...

    def count(self, counter: str, amount: float = 1.0) -> None:
        """Add to one of ``COUNTERS``."""
        ...

    def counters(self) -> dict[str, float]: ...
