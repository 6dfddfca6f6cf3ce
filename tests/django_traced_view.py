"""A Django view instrumented by ``opentelemetry-instrumentation-django`` that launches a
thread, run as a script by ``test_tracing.py`` (Django's settings are process-global).

Prints one JSON line: the request span and each ``invoke_agent`` span (ids and parents).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.urls import path

from tests.harness import Harness
from tests.test_tracing import agent
from tests.tracing_support import by_name, memory_exporter

spans = memory_exporter()
h = Harness(agent())


def chat(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"thread": h.launch("tracer", "hello")})


urlpatterns = [path("chat", chat)]
settings.configure(
    DEBUG=False,
    ROOT_URLCONF=__name__,
    ALLOWED_HOSTS=["testserver"],
    MIDDLEWARE=[],
    SECRET_KEY="not-a-secret",
)
from opentelemetry.instrumentation.django import DjangoInstrumentor  # noqa: E402

DjangoInstrumentor().instrument()
django.setup()
from django.test import Client  # noqa: E402

thread_id = Client().post("/chat").json()["thread"]
h.settle(thread_id)
finished = spans.get_finished_spans()


def ids(span: object) -> dict[str, str | None]:
    context, parent = span.context, span.parent  # type: ignore[attr-defined]
    return {
        "name": span.name,  # type: ignore[attr-defined]
        "trace": f"{context.trace_id:032x}",
        "span": f"{context.span_id:016x}",
        "parent": None if parent is None else f"{parent.span_id:016x}",
    }


requests = [s for s in finished if s.name.startswith("POST")]
print(
    json.dumps(
        {
            "requests": [ids(s) for s in requests],
            "slices": [ids(s) for s in by_name(finished, "invoke_agent")],
            "all": [ids(s) for s in finished],
        }
    )
)
