"""``RateLimit``: what a provider endpoint allows, and ``ProviderLimits``: what it says back.

A limit is given on the model (``OpenAIModel(..., rate_limit=RateLimit(rpm=500))``) or by
the deployment (``DORMANT_RATE_LIMITS``, read by ``Settings``); the slice asks for
admission against it before every model call (``runtime/admission.py``). The provider's
own view (``Retry-After`` and the ``x-ratelimit-*`` headers, OpenAI's and Anthropic's
spellings) comes back as ``ProviderLimits``: a 429 empties the shared bucket until its wait.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from dormant.errors import ConfigurationError

__all__ = ["ProviderLimits", "RateLimit", "provider_limits"]


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Requests per minute, tokens per minute and concurrent calls allowed to one bucket
    (a provider endpoint and key), shared by every worker. ``None`` leaves that dimension
    unlimited.

    A request's tokens are estimated before the call (a quarter of the request's
    characters, plus its ``max_tokens`` or else ``output_tokens``) and corrected by the
    completion's usage after. Models naming the same ``bucket`` share it (several models
    on one key); by default the bucket is the model's name and base URL.

    Background work leaves ``reserve`` of each limit to slices woken by user text, in two
    ways: it never spends the last ``reserve`` of the bucket (at least one request, and one
    concurrent call of two or more), so dormant admits a user's message at once even while
    a burst of background threads queues; and it is paced at ``1 - reserve`` of each rate,
    in bursts of at most ``burst_s`` seconds' worth, so the provider's own limit, which
    dormant cannot see, has room for that message too. Pacing also keeps a fleet within a
    provider that enforces its minute over seconds (OpenAI and Anthropic say they may) or
    counts any 60 s window: a full minute's bucket spent at once, then the rate, is up to
    twice the limit in one window, answered with 429s that say "wait up to a minute".
    """

    rpm: float | None = None
    tpm: float | None = None
    concurrency: int | None = None
    bucket: str | None = None
    reserve: float = 0.05
    output_tokens: int = 512
    """Expected output tokens of a request that sets no ``max_tokens``."""
    burst_s: float = 1.0
    """Background calls go at most this many seconds' worth (of the paced rate) at once."""

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "concurrency"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigurationError(f"RateLimit.{name} must be positive, not {value!r}")
        if not 0 <= self.reserve < 1:
            raise ConfigurationError(f"RateLimit.reserve must be in [0, 1), not {self.reserve!r}")
        if self.output_tokens < 0:
            raise ConfigurationError("RateLimit.output_tokens must not be negative")
        if not 0 < self.burst_s <= 60:
            raise ConfigurationError(f"RateLimit.burst_s must be in (0, 60], not {self.burst_s!r}")

    @classmethod
    def from_mapping(cls, where: str, raw: object) -> RateLimit:
        """A limit from its JSON object (``{"rpm": 500, "tpm": 200000, "concurrency": 20}``)."""
        known = {f.name for f in fields(cls)}
        if not isinstance(raw, Mapping) or not set(raw) <= known:
            raise ConfigurationError(
                f"{where}: {raw!r} is not an object of {', '.join(sorted(known))}"
            )
        values: dict[str, Any] = dict(raw)
        try:
            return cls(**values)
        except TypeError as error:
            raise ConfigurationError(f"{where}: {error}") from None

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.concurrency is not None

    @property
    def paced_share(self) -> float:
        """The share of each rate background work is paced at."""
        return 1 - self.reserve

    @property
    def paced_requests(self) -> float:
        """The most requests the background pace holds (0: no ``rpm``): at least one."""
        if not self.rpm:
            return 0.0
        return max(1.0, self.rpm * self.paced_share * self.burst_s / 60)

    @property
    def paced_tokens(self) -> float:
        """The most tokens the background pace holds (0: no ``tpm``). A call is charged
        the tokens calls have been using, at most this: one larger leaves the pace in
        debt, so it is never refused for ever."""
        if not self.tpm:
            return 0.0
        return self.tpm * self.paced_share * self.burst_s / 60


@dataclass(frozen=True, slots=True)
class ProviderLimits:
    """What a provider's response headers said about its limits (None: not said)."""

    retry_after_s: float | None = None
    requests_remaining: float | None = None
    requests_reset_s: float | None = None
    tokens_remaining: float | None = None
    tokens_reset_s: float | None = None

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


_OPENAI = ("x-ratelimit-remaining-{}", "x-ratelimit-reset-{}")
_ANTHROPIC = ("anthropic-ratelimit-{}-remaining", "anthropic-ratelimit-{}-reset")


def provider_limits(
    headers: Mapping[str, str], now: datetime, retry_after_s: float | None = None
) -> ProviderLimits:
    """The limits in ``headers`` (case-insensitive, as httpx gives them): OpenAI's
    ``x-ratelimit-remaining-requests``/``-tokens`` with their ``x-ratelimit-reset-*``
    durations (``1s``, ``6m0s``, ``20ms``), and Anthropic's
    ``anthropic-ratelimit-requests-remaining``/``-tokens-``/``-input-tokens-`` with their
    RFC 3339 reset times."""
    requests = _pair(headers, "requests", now)
    tokens = _pair(headers, "tokens", now)
    if tokens == (None, None):
        tokens = _pair(headers, "input-tokens", now)
    return ProviderLimits(retry_after_s, *requests, *tokens)


def _pair(
    headers: Mapping[str, str], what: str, now: datetime
) -> tuple[float | None, float | None]:
    for remaining_name, reset_name in (_OPENAI, _ANTHROPIC):
        remaining = _number(headers.get(remaining_name.format(what)))
        reset = _reset_s(headers.get(reset_name.format(what)), now)
        if remaining is not None or reset is not None:
            return remaining, reset
    return None, None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _reset_s(raw: str | None, now: datetime) -> float | None:
    """Seconds until a reset given as a duration (OpenAI) or a time (Anthropic)."""
    if raw is None:
        return None
    raw = raw.strip()
    parts = _DURATION.findall(raw)
    if parts and "".join(n + u for n, u in parts) == raw:
        return sum(float(n) * _UNIT_S[u] for n, u in parts)
    seconds = _number(raw)
    if seconds is not None:
        return seconds
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
