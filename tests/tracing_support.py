"""One OpenTelemetry SDK for the test process, exporting to memory.

The API accepts a global tracer provider once per process, so every test module that
traces shares this one, and each test clears the exporter first.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator

__all__ = ["by_name", "histogram_points", "memory_exporter", "memory_metrics", "only"]

_exporter = InMemorySpanExporter()


class _OwnRandomIds(IdGenerator):
    """Ids from a stream of their own. The SDK's default draws from the global ``random``,
    and once this provider is set, every later test's slices make spans on worker threads:
    a draw while Hypothesis generates data (``test_callback_fuzz.py``) fails that test."""

    def __init__(self) -> None:
        self._random = random.Random()

    def generate_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._random.getrandbits(128) or 1


def memory_exporter() -> InMemorySpanExporter:
    """The process's in-memory exporter, cleared, behind an SDK tracer provider."""
    found = trace.get_tracer_provider()
    if not isinstance(found, TracerProvider):
        provider = TracerProvider(id_generator=_OwnRandomIds())
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


_reader: InMemoryMetricReader | None = None


def memory_metrics() -> InMemoryMetricReader:
    """The process's in-memory metric reader, behind an SDK meter provider (set once)."""
    global _reader
    if _reader is None:
        _reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))
    return _reader


def histogram_points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    """The data points ``name`` has now (a histogram's, with their attributes)."""
    data = reader.get_metrics_data()
    found: list[Any] = []
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found += list(metric.data.data_points)
    return found
