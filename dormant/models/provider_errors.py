"""Provider failures as dormant errors: what is worth retrying, and how long to wait.

Both SDKs run with their own retries off (``max_retries=0``): a retry inside the SDK
would be invisible to the slice's bounded backoff and to the stall counter, so every
failure surfaces here once and ``complete_with_retry`` decides.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from dormant.errors import ModelError, ModelFatal, ModelRetryable
from dormant.rate_limit import provider_limits

__all__ = ["RETRYABLE_STATUSES", "retry_after_s", "status_error", "truncated"]

RETRYABLE_STATUSES = frozenset({408, 409, 429})
"""Client-side statuses worth retrying (timeouts, lock conflicts, rate limits); all 5xx are too,
529 (overloaded) included."""


def retry_after_s(headers: Mapping[str, str], now_s: float | None = None) -> float | None:
    """The provider's wait hint in seconds: ``retry-after-ms``, then ``retry-after``
    (seconds or an HTTP date); None when absent or unreadable."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        seconds = _number(raw_ms)
        if seconds is not None:
            return seconds / 1000
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _number(raw)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


def status_error(
    provider: str, status: int, message: str, headers: Mapping[str, str]
) -> ModelError:
    """The dormant error for an HTTP error status from ``provider``."""
    text = f"{provider} returned HTTP {status}: {message}"
    if status >= 500 or status in RETRYABLE_STATUSES:
        hint_s = retry_after_s(headers)
        limits = provider_limits(headers, datetime.now(UTC), hint_s)
        return ModelRetryable(text, retry_after_s=hint_s, status=status, limits=limits)
    return ModelFatal(text, status=status)


def truncated(provider: str, detail: str) -> ModelRetryable:
    """A stream that ended before its final event: the partial turn is discarded."""
    return ModelRetryable(
        f"{provider} stream ended early ({detail}); the partial turn was discarded"
    )


def _number(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
