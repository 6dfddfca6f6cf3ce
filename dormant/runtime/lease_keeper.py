"""Keeps the leases of the slices a process runs alive, from one daemon thread.

A slice holds its thread's lease from its start to its commit: through a model request
that streams nothing for a minute (a reasoning model thinking), a local tool, a slow
commit. When only a streamed chunk renewed it, the lease's time-to-live had to cover a
whole model request (150 s), and a worker killed mid-slice left its thread unrun that
long. Here one thread per process renews every lease its slices hold, each a third of its
time-to-live after the last renewal, so the time-to-live only has to outlast a renewal or
two that come late (``Settings.lease_ttl_s``, 30 s): a dead worker's threads are re-driven
that soon, and a live one keeps its lease however long its model takes.

A renewal refused (the lease was revoked by a close, flushed with Redis, or expired while
Redis was paused) marks the hold ``lost``; the slice looks at that flag at its next step
and stops (``LeaseLost``) without a call of its own. A slice past ``renew_for_s`` (its
deadline) is renewed no more, so a hung slice cannot hold its thread forever; the hold
ends with the slice however it ends, so a slice that dies in the process (a simulated
crash) stops being renewed, as a killed worker would.

A model call's concurrency slot (``runtime/admission.py``) is kept the same way: its lease
in the limiter is the same short time-to-live, so a worker that dies mid-call gives its
slot back in seconds, not after the request's whole timeout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from dormant.stores.base import Lease

__all__ = ["Hold", "LeaseKeeper", "keeper"]

log = logging.getLogger("dormant.lease")


Renew = Callable[[float], bool]
"""Extends a lease by the seconds given; False when it is no longer held."""


@dataclass(eq=False)
class Hold:
    """One lease as the keeper renews it."""

    renew: Renew
    what: str
    """What the lease is for, as a log line names it."""
    ttl_s: float
    renew_until: float
    """Monotonic seconds past which the lease is left to expire (the slice's deadline)."""
    due_at: float = field(default=0.0)
    """When the next renewal is due (monotonic seconds)."""
    lost: bool = False
    """A renewal was refused: another holder may have the thread now."""
    renewals: int = 0


class LeaseKeeper:
    """The holds of one process and the daemon thread that renews them."""

    def __init__(self) -> None:
        self._wakeup = threading.Condition()
        self._holds: set[Hold] = set()
        self._pid = 0

    def keep(
        self, lease: Lease, thread_id: str, token: str, ttl_s: float, renew_for_s: float | None
    ) -> AbstractContextManager[Hold]:
        """Renew ``token``'s lease on ``thread_id`` while the block runs (for at most
        ``renew_for_s``; None: for as long as it runs)."""
        return self.keep_alive(
            lambda ttl: lease.renew(thread_id, token, ttl),
            f"the lease of thread {thread_id}",
            ttl_s,
            renew_for_s,
        )

    @contextmanager
    def keep_alive(
        self, renew: Renew, what: str, ttl_s: float, renew_for_s: float | None
    ) -> Iterator[Hold]:
        """Call ``renew(ttl_s)`` every third of ``ttl_s`` while the block runs (for at most
        ``renew_for_s``; None: for as long as it runs)."""
        now = time.monotonic()
        until = now + renew_for_s if renew_for_s is not None else float("inf")
        hold = Hold(renew, what, ttl_s, until, due_at=now + ttl_s / 3)
        with self._wakeup:
            self._start_in_this_process()
            self._holds.add(hold)
            self._wakeup.notify()
        try:
            yield hold
        finally:
            with self._wakeup:
                self._holds.discard(hold)

    def _start_in_this_process(self) -> None:
        """Start the renewing thread once per process (a forked child starts its own)."""
        pid = os.getpid()
        if self._pid == pid:
            return
        self._pid = pid
        self._holds = set()  # a parent's holds are the parent's to renew
        threading.Thread(target=self._run, name="dormant-lease-keeper", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._wakeup:
                due = self._due(time.monotonic())
                while not due:
                    dues = [h.due_at for h in self._holds if h.due_at != float("inf")]
                    next_at = min(dues, default=None)
                    self._wakeup.wait(None if next_at is None else next_at - time.monotonic())
                    due = self._due(time.monotonic())
            for hold in due:
                self._renew(hold)

    def _due(self, now: float) -> list[Hold]:
        due = [h for h in self._holds if h.due_at <= now and not h.lost]
        for hold in due:
            hold.due_at = now + hold.ttl_s / 3
        stale = [h for h in self._holds if h.renew_until <= now or h.lost]
        for hold in stale:  # past its deadline, or lost: nothing more to renew
            hold.due_at = float("inf")
        return [h for h in due if h.renew_until > now]

    @staticmethod
    def _renew(hold: Hold) -> None:
        try:
            renewed = hold.renew(hold.ttl_s)
        except Exception:  # Redis unreachable: the next renewal tries again; the commit
            log.warning("could not renew %s", hold.what)  # fences a slice's writes
            return
        if renewed:
            hold.renewals += 1
        else:
            hold.lost = True


keeper = LeaseKeeper()
"""The process's keeper: every slice of every ``SliceDeps`` in the process shares it."""
