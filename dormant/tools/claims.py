"""A running tool task's claim on its outbox row, renewed in SQL while the tool runs.

The broker's own redelivery of a dead worker's task waits for the visibility timeout (an
hour by default), and a task lost with a flushed Redis never comes back at all. So a
``dormant.tool`` task claims its row for ``ttl_s`` before it starts the tool and a
heartbeat thread renews the claim every third of that: once a claim lapses, the run is
known dead and the sweeper sends the row again, seconds later rather than an hour. A
duplicate task (a redelivery, a second send) finds the row claimed or ran and does nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["ClaimStore", "held_claim"]

log = logging.getLogger("dormant.tools")


class ClaimStore(Protocol):
    def claim_outbox(self, outbox_id: int, until: datetime) -> bool: ...

    def renew_outbox_claim(self, outbox_id: int, until: datetime) -> bool: ...


def _until(ttl_s: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=ttl_s)


@contextmanager
def held_claim(store: ClaimStore, outbox_id: int, ttl_s: float) -> Iterator[bool]:
    """Claim the row and keep the claim alive for the block; yields False (and holds
    nothing) when the row ran already or another live run holds it."""
    if not store.claim_outbox(outbox_id, _until(ttl_s)):
        yield False
        return
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(ttl_s / 3):
            try:
                if not store.renew_outbox_claim(outbox_id, _until(ttl_s)):
                    return  # the row ran (another copy finished it)
            except Exception as error:  # the database is down: the next beat tries again
                log.warning("outbox row %d: could not renew its claim (%s)", outbox_id, error)

    beat = threading.Thread(target=heartbeat, name=f"dormant-claim-{outbox_id}", daemon=True)
    beat.start()
    try:
        yield True
    finally:
        stop.set()
        beat.join(timeout=1.0)  # a renewal stuck on a dead database must not hold the task
