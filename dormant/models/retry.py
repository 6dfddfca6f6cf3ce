"""Bounded exponential backoff with jitter around ``Model.complete``."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from dormant.errors import ModelRetryable
from dormant.models.base import ChunkSink, Completion, Model, ModelRequest

__all__ = ["backoff_s", "complete_with_retry"]

_JITTER = random.Random()
"""dormant's own stream: jitter never draws from (or moves) the application's global
``random``, which a program may have seeded to repeat a run (or a test, to check that
nothing else draws from it while it generates data, as Hypothesis does)."""


def backoff_s(attempt: int, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Full-jitter backoff for the ``attempt``-th retry (1-based), capped at ``max_s``."""
    ceiling = min(max_s, base_s * (2 ** (attempt - 1)))
    return (rng or _JITTER).uniform(ceiling / 2, ceiling)


def complete_with_retry(
    model: Model,
    request: ModelRequest,
    on_chunk: ChunkSink,
    *,
    attempts: int,
    base_s: float,
    max_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> Completion:
    """One completion, retried on ``ModelRetryable``; a retry discards the partial turn.

    ``retry-after`` from the provider wins over the computed backoff (still capped).
    Raises the last ``ModelRetryable`` once ``attempts`` are spent, or any ``ModelFatal``.
    """
    for attempt in range(1, attempts + 1):
        try:
            return model.complete(request, on_chunk)
        except ModelRetryable as error:
            if attempt == attempts:
                raise
            hint = error.retry_after_s
            sleep(min(max_s, hint) if hint is not None else backoff_s(attempt, base_s, max_s))
    raise AssertionError("unreachable: attempts must be >= 1")
