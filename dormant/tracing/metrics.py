"""GenAI client metrics (``gen_ai.client.operation.duration``,
``gen_ai.client.token.usage``), recorded only where the application set a meter provider:
like traces, nothing is imported or paid without one."""

from __future__ import annotations

import sys
from typing import Any

from dormant.messages import Usage

__all__ = ["record_chat"]

_instruments: dict[int, tuple[Any, Any]] = {}
"""The two histograms per meter provider (by id): created once, not per call."""


def _histograms() -> tuple[Any, Any] | None:
    if "opentelemetry.sdk.metrics" not in sys.modules:
        return None  # no SDK meter provider can have been set: the usual case, and cheap
    metrics = sys.modules.get("opentelemetry.metrics")
    if metrics is None:
        return None
    provider = metrics.get_meter_provider()
    if isinstance(provider, metrics.NoOpMeterProvider) or type(provider).__name__.startswith(
        "_Proxy"
    ):
        return None
    found = _instruments.get(id(provider))
    if found is None:
        meter = provider.get_meter("dormant")
        duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration"
        )
        tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens used"
        )
        found = _instruments[id(provider)] = (duration, tokens)
    return found


def record_chat(
    provider: str,
    model: str,
    duration_s: float | None,
    error: BaseException | None,
    usage: Usage | None,
) -> None:
    """Record a chat call's duration (when it ends) or its token usage (when it answered)."""
    found = _histograms()
    if found is None:
        return
    duration, tokens = found
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
    }
    if duration_s is not None:
        if error is not None:
            attributes["error.type"] = type(error).__name__
        duration.record(duration_s, attributes)
    if usage is not None:
        tokens.record(usage.input_tokens, {**attributes, "gen_ai.token.type": "input"})
        tokens.record(usage.output_tokens, {**attributes, "gen_ai.token.type": "output"})
