"""The spans, with OpenTelemetry: imported only once ``switch.py`` found an SDK.

Names and attributes follow the GenAI semantic conventions of semconv 1.44 (the
``gen_ai_latest_experimental`` names, ``opentelemetry-semantic-conventions`` 0.66):
``invoke_agent {agent}`` per slice, ``chat {model}`` per model call, ``execute_tool
{tool}`` per tool run, ``gen_ai.conversation.id`` the root thread's id on each. dormant's
own attributes are under ``dormant.``.
"""

from __future__ import annotations

import json
import time
from types import TracebackType
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode

from dormant.models.base import ChunkSink, Completion, Model, ModelRequest
from dormant.runtime.children import SEED_PREFIX
from dormant.settings import Settings
from dormant.stores.base import InboxRow, OutboxRow, Snapshot
from dormant.tracing.carrier import encode, parse
from dormant.tracing.content import input_messages, output_messages
from dormant.tracing.metrics import record_chat

__all__ = ["ChatSpan", "SliceSpan", "ToolSpan"]

_SCOPE = "dormant"

_CONTINUES = frozenset({"user", "result"})
"""Inbox kinds whose sender's context a slice continues: user text (a child of the request
that sent it) and a tool's result (the turn goes on). A child's seed (a result of its own
kind, told by its id), a report, an event or a parent's note link to their sender."""


_tracers: dict[int, tuple[Any, trace.Tracer]] = {}
"""dormant's tracer per provider (by id, the provider kept so the id stays its own): an
SDK's ``get_tracer`` builds a new one each call, a quarter of two spans' cost."""


def _tracer(provider: Any) -> trace.Tracer:
    found = _tracers.get(id(provider))
    if found is None or found[0] is not provider:
        found = _tracers[id(provider)] = (provider, provider.get_tracer(_SCOPE))
    return found[1]


def _remote(text: str) -> tuple[SpanContext, int] | None:
    carried = parse(text)
    if carried is None:
        return None
    flags = trace.TraceFlags(carried.flags)
    context = SpanContext(carried.trace_id, carried.span_id, is_remote=True, trace_flags=flags)
    return context, carried.at_ms


def _origin(
    rows: list[InboxRow], new_after_s: float, now_ms: int
) -> tuple[SpanContext | None, list[Link]]:
    """The parent a slice continues (the first fresh user text or result with a context)
    and links to every other context its rows carried: batched messages, a child's or an
    event's sender, and a turn left longer than ``new_after_s`` (a new trace)."""
    parent: SpanContext | None = None
    links: list[Link] = []
    for row in rows:
        found = _remote(row.trace)
        if found is None:
            continue
        context, at_ms = found
        kind: str = "child" if row.message_id.startswith(SEED_PREFIX) else row.message.kind
        fresh = now_ms - at_ms <= new_after_s * 1000
        if parent is None and fresh and kind in _CONTINUES:
            parent = context
            continue
        why = kind if fresh else "after_gap"
        links.append(
            Link(context, {"dormant.link.reason": why, "dormant.message.id": row.message_id})
        )
    return parent, links


def _context(parent: SpanContext | None) -> Any:
    return None if parent is None else trace.set_span_in_context(NonRecordingSpan(parent))


class SliceSpan:
    """A slice's ``invoke_agent`` span (``switch.SliceTrace``)."""

    def __init__(
        self, provider: Any, settings: Settings, snap: Snapshot, redelivered: bool
    ) -> None:
        self._tracer = _tracer(provider)
        self._settings = settings
        thread = snap.thread
        self._conversation = thread.root_id or thread.id
        now_ms = int(time.time() * 1000)
        parent, links = _origin(snap.inbox, settings.trace_new_after_s, now_ms)
        kinds = sorted({row.message.kind for row in snap.inbox})
        self.span = self._tracer.start_span(
            f"invoke_agent {thread.agent}",
            context=_context(parent),
            kind=SpanKind.INTERNAL,
            links=links,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": thread.agent,
                "gen_ai.conversation.id": self._conversation,
                "dormant.thread.id": thread.id,
                "dormant.wake.reason": ",".join(kinds),
                "dormant.slice.attempt": thread.failures + 1,
                "dormant.slice.inbox_rows": len(snap.inbox),
                "dormant.code_version.previous": thread.code_version,
                "dormant.slice.redelivered": redelivered,
            },
        )

    def carrier(self) -> str:
        context = self.span.get_span_context()
        return encode(context.trace_id, context.span_id, int(context.trace_flags))

    def chat_model(self, model: Model) -> Model:
        return ChatModel(self, model)

    def committed(self, first_seq: int, last_seq: int, code_version: str) -> None:
        self.span.set_attributes(
            {
                "dormant.slice.seq_first": first_seq,
                "dormant.slice.seq_last": last_seq,
                "dormant.code_version": code_version,
                "gen_ai.agent.version": code_version,
            }
        )

    def event(self, name: str, attributes: dict[str, Any]) -> None:
        self.span.add_event(name, attributes)

    def end(self, outcome: object) -> None:
        kind = type(outcome).__name__
        self.span.set_attribute("dormant.slice.outcome", kind)
        if kind == "Stale":  # a duplicate model call, explained
            self.span.set_attribute("dormant.slice.lost_version_guard", True)
        elif kind == "Failed":
            self.span.set_status(Status(StatusCode.ERROR, str(getattr(outcome, "error", ""))))
        self.span.end()

    def fail(self, error: BaseException) -> None:
        self.span.record_exception(error)
        self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self.span.end()


class ChatModel:
    """``model``, each call of which runs in a ``chat {model}`` span of its own. Admission
    control asks before it calls the model: a call it refuses never reaches this, so a
    deferral is no chat span and no GenAI metric point (the slice span's
    ``dormant.admission.wait`` event tells it), and each attempt of a retried call is one
    span, as the conventions count calls."""

    def __init__(self, owner: SliceSpan, model: Model) -> None:
        self._owner = owner
        self._model = model
        self.name = model.name
        self.context_window = model.context_window

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)  # base_url, rate_limit: what admission reads

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        with ChatSpan(self._owner, self._model, request) as chat:
            completion = self._model.complete(request, on_chunk)
            chat.done(completion)
            return completion


class ChatSpan:
    """A model call's ``chat {model}`` span, current while the model runs (an HTTP
    client's own instrumentation nests under it)."""

    def __init__(self, owner: SliceSpan, model: Model, request: ModelRequest) -> None:
        self._owner = owner
        self._model = model
        provider, _, name = model.name.rpartition(":")
        self._provider = provider or type(model).__name__.lower()
        self._name = name
        settings = request.settings
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self._provider,
            "gen_ai.request.model": name,
            "gen_ai.conversation.id": owner._conversation,
            "dormant.thread.id": request.thread_id,
        }
        if settings.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = settings.max_tokens
        if settings.temperature is not None:
            attributes["gen_ai.request.temperature"] = settings.temperature
        if owner._settings.trace_content:
            attributes["gen_ai.system_instructions"] = request.instructions
            attributes["gen_ai.input.messages"] = input_messages(request.items)
        parent = trace.set_span_in_context(owner.span)
        self.span = owner._tracer.start_span(
            f"chat {name}", context=parent, kind=SpanKind.CLIENT, attributes=attributes
        )
        self._use = trace.use_span(self.span, end_on_exit=False)
        self._started = time.monotonic()

    def __enter__(self) -> ChatSpan:
        self._use.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._use.__exit__(kind, error, tb)
        if error is not None:
            self.span.set_attribute("error.type", type(error).__name__)
            self.span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
        record_chat(self._provider, self._name, time.monotonic() - self._started, error, None)
        self.span.end()

    def done(self, completion: Completion) -> None:
        usage = completion.usage
        finish = "tool_calls" if completion.calls else "stop"
        self.span.set_attributes(
            {
                "gen_ai.response.model": self._name,
                "gen_ai.response.finish_reasons": (finish,),
                "gen_ai.usage.input_tokens": usage.input_tokens,
                "gen_ai.usage.output_tokens": usage.output_tokens,
                "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
            }
        )
        if self._owner._settings.trace_content:
            self.span.set_attribute("gen_ai.output.messages", output_messages(completion, finish))
        record_chat(self._provider, self._name, None, None, usage)


class ToolSpan:
    """One tool run's ``execute_tool {tool}`` span (``switch.ToolTrace``), a child of the
    slice that wrote the row, current while the tool runs: the result it hands in carries
    it to the next slice. A deferred tool's span ends when it returns (the run), its result
    arriving later as a link on the slice that applies it."""

    def __init__(
        self,
        provider: Any,
        settings: Settings,
        row: OutboxRow,
        tool: str,
        conversation_id: str,
        run: int,
        arguments: dict[str, Any],
    ) -> None:
        found = _remote(row.trace)
        self.span = _tracer(provider).start_span(
            f"execute_tool {tool}",
            context=_context(None if found is None else found[0]),
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": row.call_id,
                "gen_ai.tool.type": "function",
                "gen_ai.conversation.id": conversation_id,
                "dormant.thread.id": row.thread_id,
                "dormant.outbox.id": row.id,
                "dormant.tool.run": run,
                "dormant.tool.action": row.action,
            },
        )
        if settings.trace_content:
            self.span.set_attribute(
                "gen_ai.tool.call.arguments", json.dumps(arguments, default=str)
            )
        self._use = trace.use_span(self.span, end_on_exit=False)

    def __enter__(self) -> ToolSpan:
        self._use.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._use.__exit__(kind, error, tb)
        if error is not None:
            self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self.span.end()

    def ended(self, outcome: object) -> None:
        kind = type(outcome).__name__
        self.span.set_attribute("dormant.tool.outcome", kind)
        if kind == "Raised":
            self.span.set_attribute("error.type", "tool_error")
            self.span.set_status(Status(StatusCode.ERROR, str(getattr(outcome, "error", ""))))
        elif kind == "Started":
            self.span.set_attribute("dormant.tool.deferred", True)
