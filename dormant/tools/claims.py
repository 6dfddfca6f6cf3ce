"""A running tool task's claim on its outbox row, renewed in the store while the tool runs.

The broker's own redelivery of a dead worker's task waits for the visibility timeout (an
hour by default), and a task lost with a flushed Redis never comes back at all. So a
``dormant.tool`` task claims its row for ``ttl_s`` before it starts the tool, and the claim
is renewed every third of that while the tool runs: once a claim lapses, the run is known
dead and the sweeper sends the row again, seconds later rather than an hour. A duplicate
task (a redelivery, a second send) finds the row claimed or ran and does nothing.

One renewing thread per process serves every claim held in it. A thread started and
joined per tool run cost 10-15 % of the embedded runtime's completions per CPU-second on
a workload that runs a tool every turn; most tools finish long before their first renewal.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["ClaimStore", "claim_run", "held_claim", "renewed_claim"]

log = logging.getLogger("dormant.tools")


class ClaimStore(Protocol):
    def claim_outbox(self, outbox_id: int, until: datetime) -> int: ...

    def renew_outbox_claim(self, outbox_id: int, until: datetime) -> bool: ...


def _until(ttl_s: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=ttl_s)


@dataclass(eq=False)
class _Claim:
    store: ClaimStore
    outbox_id: int
    ttl_s: float
    held: bool = field(default=True)


class _Renewer:
    """Renews every claim held in this process, each a third of its lifetime after the
    last renewal, from one daemon thread started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: list[tuple[float, int, _Claim]] = []  # (monotonic due, tie-break, claim)
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def hold(self, claim: _Claim) -> None:
        with self._lock:
            self._schedule(claim)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="dormant-claims", daemon=True
                )
                self._thread.start()
            self._lock.notify()

    def release(self, claim: _Claim) -> None:
        """Stop renewing: the entry stays in the heap and is dropped when it comes due
        (cheaper than removing it from the middle)."""
        with self._lock:
            claim.held = False

    def _schedule(self, claim: _Claim) -> None:
        due = time.monotonic() + claim.ttl_s / 3
        heapq.heappush(self._due, (due, next(self._order), claim))

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._due or self._due[0][0] > time.monotonic():
                    wait_s = self._due[0][0] - time.monotonic() if self._due else None
                    self._lock.wait(wait_s)
                _, _, claim = heapq.heappop(self._due)
                if not claim.held:
                    continue
            renewed = self._renew(claim)
            with self._lock:
                if renewed and claim.held:
                    self._schedule(claim)

    @staticmethod
    def _renew(claim: _Claim) -> bool:
        """Renew once; False when the row ran (another copy finished it). A database that
        is down keeps the claim scheduled: the next renewal tries again."""
        try:
            return claim.store.renew_outbox_claim(claim.outbox_id, _until(claim.ttl_s))
        except Exception as error:
            log.warning("outbox row %d: could not renew its claim (%s)", claim.outbox_id, error)
            return True


_renewer = _Renewer()


def _after_fork() -> None:
    """A forked child (Celery's prefork pool) has none of its parent's threads."""
    global _renewer
    _renewer = _Renewer()


os.register_at_fork(after_in_child=_after_fork)


def claim_run(store: ClaimStore, outbox_id: int, ttl_s: float) -> int:
    """Claim the row for ``ttl_s``: the run's number (1 for the first: each earlier run
    died), or 0 when the row ran already or another live run holds it."""
    return store.claim_outbox(outbox_id, _until(ttl_s))


@contextmanager
def renewed_claim(store: ClaimStore, outbox_id: int, ttl_s: float) -> Iterator[None]:
    """Keep a claim taken by ``claim_run`` alive for the block."""
    claim = _Claim(store, outbox_id, ttl_s)
    renewer = _renewer
    renewer.hold(claim)
    try:
        yield
    finally:
        renewer.release(claim)


@contextmanager
def held_claim(store: ClaimStore, outbox_id: int, ttl_s: float) -> Iterator[int]:
    """Claim the row and keep the claim alive for the block; yields the run's number (1
    for the first: each earlier run died), or 0, holding nothing, when the row ran already
    or another live run holds it."""
    run = claim_run(store, outbox_id, ttl_s)
    if not run:
        yield 0
        return
    with renewed_claim(store, outbox_id, ttl_s):
        yield run
