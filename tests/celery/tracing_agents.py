"""An agent traced on real workers (``DORMANT_AGENTS=tracing_agents``).

Importing this module configures the worker process's OpenTelemetry SDK, as an
application's own Celery setup would, with an exporter that appends each ended span as a
JSON line to ``TEST_TRACE_FILE``: the test reads every worker's spans from it (and over
OTLP to ``TEST_OTLP_ENDPOINT``, a real trace store, when set). With
``TEST_INSTRUMENT_CELERY=1`` it also turns on ``opentelemetry-instrumentation-celery``, as
an application that already traces its Celery tasks has it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from celery_agents import _key, worker_redis  # also: the worker_ready mark the tests wait on
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from dormant import Agent, tool
from dormant.messages import Item, ToolResult
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion

__all__ = ["AGENTS"]


class JsonLinesExporter(SpanExporter):
    """Each span as one line (one ``write`` in append mode: processes never interleave)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            context, parent = span.context, span.parent
            assert context is not None
            line = {
                "name": span.name,
                "trace_id": f"{context.trace_id:032x}",
                "span_id": f"{context.span_id:016x}",
                "parent_id": None if parent is None else f"{parent.span_id:016x}",
                "attributes": dict(span.attributes or {}),
                "links": [f"{link.context.span_id:016x}" for link in span.links],
                "pid": os.getpid(),
            }
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(json.dumps(line, default=str) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _provider() -> TracerProvider:
    """The worker's SDK: spans to ``TEST_TRACE_FILE``, and over OTLP/HTTP to
    ``TEST_OTLP_ENDPOINT`` (a real trace store) when that is set."""
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": "dormant-worker", "openinference.project.name": "dormant"}
        )
    )
    if "TEST_TRACE_FILE" in os.environ:
        exporter = JsonLinesExporter(os.environ["TEST_TRACE_FILE"])
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if "TEST_OTLP_ENDPOINT" in os.environ:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        otlp = OTLPSpanExporter(endpoint=os.environ["TEST_OTLP_ENDPOINT"])
        provider.add_span_processor(SimpleSpanProcessor(otlp))
    return provider


_tracer_provider = _provider()
trace.set_tracer_provider(_tracer_provider)
if os.environ.get("TEST_INSTRUMENT_CELERY") == "1":
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().instrument(tracer_provider=_tracer_provider)


@tool
def gated_lookup(key: str) -> str:
    """A lookup that waits until the test opens its gate (the worker restart between)."""
    if key == "k0":
        assert worker_redis().blpop([_key("gate")], timeout=60) is not None
    return f"{key}=42"


def two_lookups(items: Sequence[Item]) -> Completion:
    results = [i for i in items if isinstance(i, ToolResult)]
    if len(results) < 2:
        return reply(f"looking {len(results)}", call("gated_lookup", key=f"k{len(results)}"))
    return reply("the answer is 42")


AGENTS = [
    Agent("traced", model=ScriptedModel(two_lookups), tools=[gated_lookup]),
    Agent("replier", model=ScriptedModel(lambda items: reply("hello"))),
]
