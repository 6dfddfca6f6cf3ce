"""Links from a stored trace context to a trace viewer (Grafana, Jaeger, ...), by the
``Settings.trace_url_template``: what the dashboard and ``dormant show --traces`` print.

A message applied by a traced slice keeps that slice's context (``InboxRow.trace``), so
each item a message became links to the trace of the slice that applied it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dormant.stores.base import InboxRow, InboxState, QueryStore
from dormant.tracing.carrier import parse

__all__ = ["TracedMessage", "trace_chain", "trace_url"]


def trace_url(template: str, context: str) -> str | None:
    """``template`` with ``{trace_id}`` and ``{span_id}`` filled from ``context``; None
    without a template or a context. Plain replacement, so other braces stay as they are."""
    carried = parse(context)
    if not template or carried is None:
        return None
    return template.replace("{trace_id}", f"{carried.trace_id:032x}").replace(
        "{span_id}", f"{carried.span_id:016x}"
    )


@dataclass(frozen=True)
class TracedMessage:
    """One applied message and the trace of the slice that applied it."""

    message_id: str
    kind: str
    trace_id: str
    span_id: str
    url: str | None


def trace_chain(store: QueryStore, thread_id: str, template: str = "") -> list[TracedMessage]:
    """The thread's applied messages that a traced slice applied, oldest first: the chain
    of its traces (retention prunes finished rows, and their links with them)."""
    chain = []
    for row in sorted(store.inbox(thread_id, InboxState.DONE), key=_row_id):
        carried = parse(row.trace)
        if carried is None:
            continue
        chain.append(
            TracedMessage(
                row.message_id,
                row.message.kind,
                f"{carried.trace_id:032x}",
                f"{carried.span_id:016x}",
                trace_url(template, row.trace),
            )
        )
    return chain


def _row_id(row: InboxRow) -> int:
    return row.id
