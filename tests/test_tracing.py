"""Traces of slices and tool runs (dormant.tracing) with the SDK's in-memory exporter."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dormant import Agent, tool
from dormant.errors import ModelRetryable
from dormant.messages import Item, ToolResult, UserMessage, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.rate_limit import RateLimit
from dormant.runtime.memory_limiter import MemoryLimiter
from dormant.runtime.slice import Deferred, Idle, Stale
from dormant.settings import Settings
from dormant.tracing.carrier import encode, parse
from tests.harness import Harness
from tests.tracing_support import by_name, histogram_points, memory_exporter, memory_metrics, only


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"{key}=42"


def two_lookups(items: Sequence[Item]) -> Completion:
    """A turn of three slices: two tool round trips, then the answer."""
    results = [i for i in items if isinstance(i, ToolResult)]
    if len(results) < 2:
        return reply(f"looking {len(results)}", call("lookup", key=f"k{len(results)}"))
    return reply("the answer is 42")


def agent(script: object = two_lookups) -> Agent:
    return Agent("tracer", model=ScriptedModel(script), tools=[lookup])  # type: ignore[arg-type]


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return memory_exporter()


def harness(**settings: object) -> Harness:
    return Harness(agent(), settings=Settings(model_backoff_s=0.0, **settings))  # type: ignore[arg-type]


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


def test_a_turn_of_three_slices_is_one_trace_with_every_span_parented(
    spans: InMemorySpanExporter,
) -> None:
    h = harness()
    thread_id = h.launch("tracer", "what is k?")
    assert isinstance(h.settle(thread_id), Idle)
    finished = spans.get_finished_spans()
    slices = by_name(finished, "invoke_agent tracer")
    chats = by_name(finished, "chat scripted")
    tools = by_name(finished, "execute_tool lookup")
    assert (len(slices), len(chats), len(tools)) == (3, 3, 2)
    assert {trace_id(s) for s in finished} == {trace_id(slices[0])}
    # invoke_agent -> execute_tool -> invoke_agent -> execute_tool -> invoke_agent
    assert parent_of(slices[0]) is None
    assert parent_of(tools[0]) == span_id(slices[0])
    assert parent_of(slices[1]) == span_id(tools[0])
    assert parent_of(tools[1]) == span_id(slices[1])
    assert parent_of(slices[2]) == span_id(tools[1])
    assert [parent_of(c) for c in chats] == [span_id(s) for s in slices]
    assert {s.attributes["gen_ai.conversation.id"] for s in finished} == {thread_id}  # type: ignore[index]
    first = slices[0].attributes or {}
    assert first["gen_ai.operation.name"] == "invoke_agent"
    assert first["dormant.thread.id"] == thread_id
    assert first["dormant.wake.reason"] == "user"
    assert (first["dormant.slice.seq_first"], first["dormant.slice.seq_last"]) == (1, 2)
    assert first["dormant.slice.attempt"] == 1
    assert first["dormant.code_version"]
    assert (slices[1].attributes or {})["dormant.wake.reason"] == "result"
    chat = chats[0].attributes or {}
    assert chat["gen_ai.usage.input_tokens"] == 10
    assert chat["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert (chats[2].attributes or {})["gen_ai.response.finish_reasons"] == ("stop",)
    assert (tools[0].attributes or {})["gen_ai.tool.name"] == "lookup"


def test_a_launch_inside_a_request_span_makes_the_first_slice_its_child(
    spans: InMemorySpanExporter,
) -> None:
    h = harness()
    with trace.get_tracer("a web app").start_as_current_span("POST /chat") as request:
        thread_id = h.launch("tracer", "hello")
    h.settle(thread_id)
    first = by_name(spans.get_finished_spans(), "invoke_agent")[0]
    assert parent_of(first) == request.get_span_context().span_id
    assert trace_id(first) == request.get_span_context().trace_id


def test_a_message_after_the_gap_starts_a_new_trace_linked_to_the_old_one(
    spans: InMemorySpanExporter,
) -> None:
    h = harness(trace_new_after_s=3600.0)
    thread_id = h.launch("tracer", "hello")
    h.settle(thread_id)
    old = by_name(spans.get_finished_spans(), "invoke_agent")[-1]
    spans.clear()
    two_days_ago_ms = int((time.time() - 2 * 86400) * 1000)
    carried = encode(trace_id(old), span_id(old), 1, two_days_ago_ms)
    h.store.enqueue(thread_id, "approval", UserMessage(text="approved"), 8, trace=carried)
    h.settle(thread_id)
    new = by_name(spans.get_finished_spans(), "invoke_agent")[0]
    assert new.parent is None
    assert trace_id(new) != trace_id(old)
    assert [(link.context.span_id, dict(link.attributes or {})) for link in new.links] == [
        (span_id(old), {"dormant.link.reason": "after_gap", "dormant.message.id": "approval"})
    ]


def test_message_content_is_traced_only_when_the_setting_asks(
    spans: InMemorySpanExporter,
) -> None:
    h = harness()
    h.settle(h.launch("tracer", "a secret question"))
    for span in spans.get_finished_spans():
        text = json.dumps(dict(span.attributes or {}))
        assert "secret" not in text and "gen_ai.input.messages" not in text
    spans.clear()
    h = harness(trace_content=True)
    h.settle(h.launch("tracer", "a secret question"))
    chat = by_name(spans.get_finished_spans(), "chat")[0].attributes or {}
    assert "a secret question" in str(chat["gen_ai.input.messages"])
    assert json.loads(str(chat["gen_ai.output.messages"]))[0]["role"] == "assistant"


def test_a_slice_that_lost_its_version_guard_is_marked_and_the_rerun_has_one_chat(
    spans: InMemorySpanExporter,
) -> None:
    h: Harness
    moved: list[bool] = []

    def racing(items: Sequence[Item]) -> Completion:
        if not moved:  # another writer moves the thread's version under the first slice
            moved.append(True)
            h.store.set_metadata(thread_id, {"moved": True})
        return reply("hi")

    h = Harness(agent(racing), settings=Settings(model_backoff_s=0.0))
    thread_id = h.launch("tracer", "hello")
    assert isinstance(h.step(thread_id), Stale)
    assert isinstance(h.step(thread_id), Idle)
    lost, committed = by_name(spans.get_finished_spans(), "invoke_agent")
    assert (lost.attributes or {})["dormant.slice.lost_version_guard"] is True
    assert (lost.attributes or {})["dormant.slice.outcome"] == "Stale"
    assert "dormant.slice.lost_version_guard" not in (committed.attributes or {})
    chats = by_name(spans.get_finished_spans(), "chat")
    assert [parent_of(c) for c in chats] == [span_id(lost), span_id(committed)]


def test_tracing_off_in_the_settings_emits_nothing_even_with_an_sdk(
    spans: InMemorySpanExporter,
) -> None:
    h = harness(tracing=False)
    h.settle(h.launch("tracer", "hello"))
    assert spans.get_finished_spans() == ()
    assert all(row.trace == "" for row in h.store.inbox(h.store.threads()[0].id))


def test_the_context_is_stored_with_inbox_and_outbox_rows(spans: InMemorySpanExporter) -> None:
    h = harness()
    with trace.get_tracer("a web app").start_as_current_span("request") as request:
        thread_id = h.launch("tracer", "hello")
    (row,) = h.store.inbox(thread_id)
    carried = parse(row.trace)
    assert carried is not None and carried.span_id == request.get_span_context().span_id
    h.step(thread_id)
    (outbox,) = h.outbox
    slice_span = only(spans.get_finished_spans(), "invoke_agent")
    assert parse(outbox.trace) is not None
    assert parse(outbox.trace).span_id == span_id(slice_span)  # type: ignore[union-attr]


def test_import_dormant_and_a_slice_import_no_opentelemetry() -> None:
    code = """
import sys
from dormant import Agent
from dormant.models import ScriptedModel, reply
from tests.harness import Harness
h = Harness(Agent("a", model=ScriptedModel(lambda items: reply("hi"))))
h.settle(h.launch("a", "hello"))
assert h.store.history(h.store.threads()[0].id)[-1].item.text == "hi"
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_a_carried_context_survives_its_round_trip() -> None:
    text = encode(0xABC, 0xDEF, 1, 1234)
    assert parse(text) is not None
    assert (parse(text).trace_id, parse(text).span_id, parse(text).at_ms) == (0xABC, 0xDEF, 1234)  # type: ignore[union-attr]
    assert parse("") is None and parse("garbage") is None and parse("01-x-y-z 1") is None


def test_user_text_is_stored_untraced_when_no_span_is_current(
    spans: InMemorySpanExporter,
) -> None:
    h = harness()
    thread_id = h.launch("tracer", "hello")
    assert [row.trace for row in h.store.inbox(thread_id)] == [""]


def test_a_child_thread_and_its_report_link_to_the_slices_that_sent_them(
    spans: InMemorySpanExporter,
) -> None:
    def script(items: Sequence[Item]) -> Completion:
        last = items[-1]
        if isinstance(last, UserText):
            return reply("", call("spawn_thread", instructions="look into it"))
        if isinstance(last, ToolResult) and last.content.startswith("You are now inside"):
            return reply("", call("close_thread", report="found it"))
        return reply("noted")

    family = Agent("family", model=ScriptedModel(script), threads=True)
    h = Harness(family, settings=Settings(model_backoff_s=0.0))
    root = h.launch("family", "go")
    h.drain()
    (child,) = h.store.children(root)
    slices = by_name(spans.get_finished_spans(), "invoke_agent family")
    of_child = [s for s in slices if (s.attributes or {})["dormant.thread.id"] == child.id]
    of_root = [s for s in slices if (s.attributes or {})["dormant.thread.id"] == root]
    spawner, reader = of_root[0], of_root[-1]
    assert of_child[0].parent is None, "a child's first slice starts a trace of its own"
    assert [link.context.span_id for link in of_child[0].links] == [span_id(spawner)]
    assert dict(of_child[0].links[0].attributes or {})["dormant.link.reason"] == "child"
    assert [link.context.span_id for link in reader.links] == [span_id(of_child[-1])]
    assert {(s.attributes or {})["gen_ai.conversation.id"] for s in slices} == {root}


def test_a_launch_in_an_instrumented_flask_view_makes_the_first_slice_the_requests_child(
    spans: InMemorySpanExporter,
) -> None:
    from flask import Flask
    from opentelemetry.instrumentation.flask import FlaskInstrumentor

    h = harness()
    app = Flask(__name__)

    @app.post("/chat")
    def chat() -> dict[str, str]:
        return {"thread": h.launch("tracer", "hello")}

    FlaskInstrumentor().instrument_app(app)
    try:
        thread_id = app.test_client().post("/chat").get_json()["thread"]
    finally:
        FlaskInstrumentor().uninstrument_app(app)
    h.settle(thread_id)
    finished = spans.get_finished_spans()
    request = only(finished, "POST /chat")
    first = by_name(finished, "invoke_agent")[0]
    assert parent_of(first) == span_id(request)
    assert {trace_id(s) for s in finished} == {trace_id(request)}, "one trace from the request"


def test_model_calls_are_measured_with_the_genai_metrics_where_a_meter_is_configured(
    spans: InMemorySpanExporter,
) -> None:
    reader = memory_metrics()
    h = harness()
    h.settle(h.launch("tracer", "what is k?"))
    durations = histogram_points(reader, "gen_ai.client.operation.duration")
    tokens = histogram_points(reader, "gen_ai.client.token.usage")
    assert durations and tokens
    kinds = {dict(p.attributes)["gen_ai.token.type"] for p in tokens}
    assert kinds == {"input", "output"}
    attributes = dict(durations[0].attributes)
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "scripted"
    assert sum(p.count for p in durations) >= 3


VIEWER = "https://viewer.example/trace/{trace_id}?span={span_id}"


def test_the_dashboard_links_each_applied_message_to_the_trace_that_applied_it(
    spans: InMemorySpanExporter,
) -> None:
    from datetime import UTC, datetime

    from dormant.http.ui.thread_page import thread_body

    h = harness(trace_url_template=VIEWER)
    thread_id = h.launch("tracer", "what is k?")
    h.settle(thread_id)
    body = thread_body(
        h,
        h.store.thread(thread_id),
        root="/ui",
        now=datetime.now(UTC),
        full=False,
        actions="",
        stream_url=None,
    )
    slices = by_name(spans.get_finished_spans(), "invoke_agent")
    links = [
        f"https://viewer.example/trace/{trace_id(s):032x}?span={span_id(s):016x}" for s in slices
    ]
    # the user's text and both tool results, each to the slice that applied it
    assert [body.count(f'href="{link.replace("&", "&amp;")}"') for link in links] == [1, 1, 1]
    untemplated = Harness(agent(), settings=Settings(), store=h.store)
    plain = thread_body(
        untemplated,
        h.store.thread(thread_id),
        root="/ui",
        now=datetime.now(UTC),
        full=False,
        actions="",
        stream_url=None,
    )
    assert 'class="trace"' not in plain


def test_dormant_show_traces_prints_the_chain(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dormant.cli import app
    from dormant.stores.sql.store import SQLStore, upgrade

    url = f"sqlite:///{tmp_path / 'traced.db'}"
    upgrade(url)
    store = SQLStore(url)
    h = Harness(agent(), settings=Settings(model_backoff_s=0.0), store=store)
    thread_id = h.launch("tracer", "what is k?")
    h.settle(thread_id)
    store.close()
    env = {"DORMANT_TRACE_URL_TEMPLATE": VIEWER}
    shown = CliRunner().invoke(app, ["show", thread_id, "--traces", "--database-url", url], env=env)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.strip().splitlines()
    slices = by_name(spans.get_finished_spans(), "invoke_agent")
    assert [line.split()[:2] for line in lines] == [
        [f"{trace_id(slices[0]):032x}", "user"],
        [f"{trace_id(slices[1]):032x}", "result"],
        [f"{trace_id(slices[2]):032x}", "result"],
    ]
    assert lines[0].endswith(f"?span={span_id(slices[0]):016x}")
    as_json = CliRunner().invoke(
        app, ["show", thread_id, "--traces", "--json", "--database-url", url], env=env
    )
    assert [m["kind"] for m in json.loads(as_json.output)] == ["user", "result", "result"]


def test_a_launch_in_an_instrumented_django_view_makes_the_first_slice_the_requests_child() -> None:
    script = Path(__file__).with_name("django_traced_view.py")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True, timeout=120
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    (request,) = found["requests"]
    first = found["slices"][0]
    assert first["parent"] == request["span"]
    assert {s["trace"] for s in found["all"]} == {request["trace"]}, "one trace"
    spans = {s["span"] for s in found["all"]}
    rest = [s for s in found["all"] if s["span"] != request["span"]]
    assert all(s["parent"] in spans for s in rest), "no broken parent"
    assert len(spans) == len(found["all"]), "no span twice"


def test_messages_batched_into_one_slice_continue_the_first_and_link_the_rest(
    spans: InMemorySpanExporter,
) -> None:
    h = harness()
    thread_id = h.launch("tracer", "hello")
    h.settle(thread_id)
    spans.clear()
    now_ms = int(time.time() * 1000)
    first, second = encode(0xA1, 0xB1, 1, now_ms), encode(0xA2, 0xB2, 1, now_ms)
    h.store.enqueue(thread_id, "one", UserMessage(text="one"), 8, trace=first)
    h.store.enqueue(thread_id, "two", UserMessage(text="two"), 8, trace=second)
    h.step(thread_id)
    batched = by_name(spans.get_finished_spans(), "invoke_agent")[0]
    assert batched.parent is not None and batched.parent.span_id == 0xB1
    assert trace_id(batched) == 0xA1
    assert [(link.context.trace_id, dict(link.attributes or {})) for link in batched.links] == [
        (0xA2, {"dormant.link.reason": "user", "dormant.message.id": "two"})
    ]


@tool(deferred=True)
def build(target: str) -> None:
    """Start a build; its result comes later by callback."""


def one_build(items: Sequence[Item]) -> Completion:
    if isinstance(items[-1], ToolResult):
        return reply(f"built: {items[-1].content}")
    return reply("building", call("build", target="api"))


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_deferred_tools_result_sent_from_outside_any_span_goes_on_in_its_callers_trace(
    spans: InMemorySpanExporter, backend: str, tmp_path: Path
) -> None:
    """The callback arrives with no span current (a plain HTTP request, days later within
    the gap): the slice it wakes continues the trace of the slice that made the call."""
    from dormant.stores.sql.store import SQLStore, upgrade

    store = None
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/traced.db"
        upgrade(url)
        store = SQLStore(url)
    builder = Agent("builder", model=ScriptedModel(one_build), tools=[build])
    h = Harness(builder, settings=Settings(model_backoff_s=0.0), store=store)
    thread_id = h.launch("builder", "build the api")
    h.step(thread_id)
    h.run_tools()  # the tool run starts the build and ends: its result is not in yet
    assert trace.get_current_span().get_span_context().is_valid is False
    h.deliver(thread_id, h.store.load(thread_id).calls.popitem()[0], "api: green")
    assert isinstance(h.settle(thread_id), Idle)
    slices = by_name(spans.get_finished_spans(), "invoke_agent builder")
    assert len(slices) == 2
    assert trace_id(slices[1]) == trace_id(slices[0]), "one trace for the turn"
    assert parent_of(slices[1]) == span_id(slices[0])
    assert h.history(thread_id)[-1].text == "built: api: green"  # type: ignore[union-attr]


def test_a_call_admission_defers_is_no_chat_span_and_a_429_is_one(
    spans: InMemorySpanExporter,
) -> None:
    answered_429: list[bool] = []

    def once_429(items: Sequence[Item]) -> Completion:
        if isinstance(items[-1], UserText) and items[-1].text == "b" and not answered_429:
            answered_429.append(True)
            raise ModelRetryable("rate limited", 1.0, status=429)
        return reply("done")

    h = Harness(agent(once_429), settings=Settings(model_backoff_s=0.0))
    limit = RateLimit(rpm=1, reserve=0.0)
    limiter = MemoryLimiter(clock=lambda: 1000.0)  # time stands still: one call a minute
    settings = replace(h.deps.settings, rate_limits=(("scripted", limit),))
    h.deps = replace(h.deps, settings=settings, limiter=limiter)
    first, second = h.launch("tracer", "a"), h.launch("tracer", "b")
    assert isinstance(h.step(first), Idle)
    assert isinstance(h.step(second), Deferred)  # refused: the model was never asked
    finished = spans.get_finished_spans()
    assert len(by_name(finished, "chat scripted")) == 1, "a refused ask made a chat span"
    refused = by_name(finished, "invoke_agent")[1]
    assert [e.name for e in refused.events] == ["dormant.admission.wait"]

    h.deps = replace(h.deps, limiter=MemoryLimiter())  # capacity again: the provider says 429
    assert isinstance(h.step(second), Deferred)
    chats = by_name(spans.get_finished_spans(), "chat scripted")
    assert len(chats) == 2
    assert (chats[1].attributes or {})["error.type"] == "ModelRetryable"
