"""Whether this process traces, and the no-op stand-ins when it does not.

Tracing is on when ``Settings.tracing`` allows it and the application has set a real tracer
provider (an SDK's): the check looks in ``sys.modules`` for an ``opentelemetry.trace``
something else imported, so without the API, or with the API and no SDK, nothing is
imported and a slice's hooks are calls on ``UNTRACED``. Asked at every slice, not once: an
application may configure its SDK after dormant's worker is built (Celery's
``worker_process_init``).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dormant.models.base import Model
    from dormant.settings import Settings
    from dormant.stores.base import OutboxRow, Snapshot

__all__ = [
    "UNTRACED",
    "SliceTrace",
    "ToolTrace",
    "provider",
    "start_slice",
    "start_tool",
]


class SliceTrace(Protocol):
    """A slice's ``invoke_agent`` span, from its load to its end."""

    def carrier(self) -> str:
        """The slice's context as stored with its outbox rows and its messages to other
        threads ("" untraced)."""
        ...

    def chat_model(self, model: Model) -> Model:
        """``model``, each of its calls traced as a ``chat`` span (untraced: ``model``)."""
        ...

    def committed(self, first_seq: int, last_seq: int, code_version: str) -> None:
        """The seqs the commit wrote and the agent version that ran."""
        ...

    def event(self, name: str, attributes: dict[str, Any]) -> None:
        """An admission wait, a budget stop."""
        ...

    def end(self, outcome: object) -> None:
        """End the span with the slice's outcome (``Stale``: the commit lost its version
        guard, so a duplicate model call is marked rather than hidden)."""
        ...

    def fail(self, error: BaseException) -> None:
        """End the span with an exception that left ``run_slice``."""
        ...


class ToolTrace(Protocol):
    def __enter__(self) -> ToolTrace: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def ended(self, outcome: object) -> None:
        """What the run did (``Raised`` marks the span an error)."""
        ...


class _Untraced:
    """Every hook, doing nothing: what a slice and a tool run use when tracing is off."""

    def carrier(self) -> str:
        return ""

    def chat_model(self, model: Model) -> Model:
        return model

    def committed(self, first_seq: int, last_seq: int, code_version: str) -> None:
        pass

    def event(self, name: str, attributes: dict[str, Any]) -> None:
        pass

    def end(self, outcome: object) -> None:
        pass

    def fail(self, error: BaseException) -> None:
        pass

    def ended(self, outcome: object) -> None:
        pass

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass


UNTRACED = _Untraced()
"""The no-op trace of a slice or tool run."""


def provider(settings: Settings) -> Any | None:
    """The application's tracer provider, or None: tracing is off in ``settings``, nothing
    imported OpenTelemetry, or no SDK replaced the API's default (proxy) provider."""
    if not settings.tracing:
        return None
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    found = trace.get_tracer_provider()
    if isinstance(found, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return found


def start_slice(settings: Settings, snap: Snapshot, redelivered: bool = False) -> SliceTrace:
    """The ``invoke_agent`` span of a slice that loaded ``snap`` (``UNTRACED`` when off);
    ``redelivered``: its task came back from a worker that died with it."""
    found = provider(settings)
    if found is None:
        return UNTRACED
    from dormant.tracing.spans import SliceSpan

    return SliceSpan(found, settings, snap, redelivered)


def start_tool(
    settings: Settings,
    row: OutboxRow,
    tool: str,
    conversation_id: str,
    run: int,
    arguments: dict[str, Any],
) -> ToolTrace:
    """The ``execute_tool`` span of one run of ``row``, a child of the slice that wrote
    it; current while the tool runs, so its result carries it to the next slice."""
    found = provider(settings)
    if found is None:
        return UNTRACED
    from dormant.tracing.spans import ToolSpan

    return ToolSpan(found, settings, row, tool, conversation_id, run, arguments)
