"""OpenTelemetry traces of slices and tool runs, when the application configured an SDK.

One trace per hot turn: the slice woken by user text starts it (a child of the sender's
span when ``send`` ran inside one), the slices woken by its tool results continue it, the
tool runs are its children; no span stays open across a suspension. The context travels
with the work (``carrier.py``): stored with each inbox and outbox row, and in the tool
task's Celery header. docs/tracing.md has the spans and their attributes.

Nothing here imports OpenTelemetry: ``switch.py`` looks for a configured tracer provider
in modules already imported, and only then imports ``spans.py``. Off, a slice pays one
dict lookup and no-op calls.
"""

from __future__ import annotations

from dormant.tracing.carrier import capture
from dormant.tracing.switch import UNTRACED, SliceTrace, provider, start_slice, start_tool

__all__ = ["UNTRACED", "SliceTrace", "capture", "provider", "start_slice", "start_tool"]
