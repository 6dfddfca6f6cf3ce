"""Retention: delete what no thread will read again, in small batches.

``prune`` calls ``Store.prune_batch`` until a batch finds nothing: each batch deletes at
most ``batch`` closed thread trees, then at most ``batch`` finished inbox rows, ran outbox
rows and fired timers, each in its own short transaction, so the hot tables are never
locked for long and a busy deployment can prune while it runs. Used by ``dormant prune``
and the opt-in beat task ``dormant.prune`` (``Settings.prune_older_than_s``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta

from dormant.errors import ConfigurationError
from dormant.stores.base import PruneCounts, Store

__all__ = ["parse_age", "prune"]

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w`` or ``45s`` as a duration."""
    found = _AGE.fullmatch(text.strip().lower())
    if found is None:
        raise ConfigurationError(f"{text!r} is not an age: use a number and s, m, h, d or w (30d)")
    return timedelta(seconds=float(found[1]) * _UNIT_S[found[2]])


def prune(
    store: Store,
    older_than: datetime,
    *,
    batch: int = 500,
    dry_run: bool = False,
    on_batch: Callable[[PruneCounts], None] | None = None,
) -> PruneCounts:
    """Delete closed thread trees and finished rows older than ``older_than``; the counts.
    ``on_batch`` hears each batch's counts (progress). ``dry_run`` deletes nothing and
    counts every candidate."""
    if batch < 1:
        raise ConfigurationError("the prune batch size must be at least 1")
    if dry_run:
        return store.prune_batch(older_than, batch, dry_run=True)
    total = PruneCounts()
    while True:
        counts = store.prune_batch(older_than, batch)
        if counts.total == 0:
            return total
        total += counts
        if on_batch is not None:
            on_batch(counts)
