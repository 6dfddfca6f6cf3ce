"""The trace context as it is stored with a row and sent in a Celery header.

A W3C ``traceparent`` and the time it was taken, in one short string
(``00-<trace id>-<span id>-<flags> <unix ms>``): the time lets a slice tell a fresh
continuation from a wake after a long gap (``Settings.trace_new_after_s``), which then
starts a new trace linked to the old one. Parsing needs no OpenTelemetry; taking the
current context looks only at an ``opentelemetry.trace`` something else already imported,
so a process without the API, or one that never imported it, pays a dict lookup.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

__all__ = ["Carried", "capture", "encode", "parse"]


@dataclass(frozen=True, slots=True)
class Carried:
    """A stored trace context."""

    trace_id: int
    span_id: int
    flags: int
    at_ms: int
    """When it was taken (unix ms)."""


def encode(trace_id: int, span_id: int, flags: int, at_ms: int | None = None) -> str:
    at = int(time.time() * 1000) if at_ms is None else at_ms
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x} {at}"


def parse(text: str) -> Carried | None:
    """The context ``text`` holds, or None (empty, or not one this module wrote)."""
    if not text:
        return None
    try:
        parent, at = text.split(" ", 1)
        version, trace_hex, span_hex, flags_hex = parent.split("-")
        carried = Carried(int(trace_hex, 16), int(span_hex, 16), int(flags_hex, 16), int(at))
    except ValueError:
        return None
    if version != "00" or not carried.trace_id or not carried.span_id:
        return None
    return carried


def capture() -> str:
    """The caller's current span as a stored context, or "" when there is none (no
    OpenTelemetry imported, no span active): what ``send``/``launch`` keep with the row."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return ""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    return encode(context.trace_id, context.span_id, int(context.trace_flags))
