"""One OpenTelemetry SDK for the test process, exporting to memory.

The API accepts a global tracer provider once per process, so every test module that
traces shares this one, and each test clears the exporter first.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["by_name", "memory_exporter", "only"]

_exporter = InMemorySpanExporter()


def memory_exporter() -> InMemorySpanExporter:
    """The process's in-memory exporter, cleared, behind an SDK tracer provider."""
    found = trace.get_tracer_provider()
    if not isinstance(found, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    _exporter.clear()
    return _exporter


def by_name(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    """The spans whose name starts with ``prefix``, in the order they started."""
    return sorted((s for s in spans if s.name.startswith(prefix)), key=lambda s: s.start_time or 0)


def only(spans: Sequence[ReadableSpan], prefix: str) -> ReadableSpan:
    found = by_name(spans, prefix)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]
