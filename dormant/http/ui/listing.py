"""The thread list: threads by status and agent, newest first, paged by keyset.

The page reads only the ``threads`` rows (no history, no calls), one indexed query per page:
it stays as fast over 100K threads as over ten (``bench/dashboard_listing.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from dormant.errors import MalformedMessage
from dormant.http.ui.html import STATUSES, ago, badge, esc, href, short
from dormant.stores.base import QueryStore, ThreadInfo, ThreadStatus

__all__ = ["PAGE_SIZE", "ListQuery", "cursor", "list_body"]

PAGE_SIZE = 50


@dataclass(frozen=True)
class ListQuery:
    """What the list shows: its filters and where the page starts."""

    status: ThreadStatus | None = None
    agent: str | None = None
    before: tuple[datetime, str] | None = None

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> ListQuery:
        """From the page's query string; ``MalformedMessage`` for a value that is not one."""
        status = query.get("status") or None
        if status is not None and status not in STATUSES:
            raise MalformedMessage(f"unknown status {status!r}: one of {', '.join(STATUSES)}")
        before = None
        if query.get("before"):
            stamp, sep, thread_id = query["before"].partition("~")
            try:
                before = (datetime.fromisoformat(stamp), thread_id)
            except ValueError:
                sep = ""
            if not sep or not thread_id:
                raise MalformedMessage(f"not a page cursor: {query['before']!r}")
        return cls(ThreadStatus(status) if status else None, query.get("agent") or None, before)


def cursor(info: ThreadInfo) -> str:
    """A page cursor: where the next page starts (``ListQuery``'s ``before``)."""
    return f"{info.created_at.isoformat()}~{info.id}"


def list_body(store: QueryStore, query: ListQuery, root: str, now: datetime) -> str:
    """The filters, one page of threads and the link to the next page."""
    found = store.threads(query.status, PAGE_SIZE + 1, agent=query.agent, before=query.before)
    shown, more = found[:PAGE_SIZE], len(found) > PAGE_SIZE
    status = query.status.value if query.status else None
    rows = "".join(_row(info, root, now) for info in shown) or (
        '<tr><td colspan="6" class="empty">No threads match these filters.</td></tr>'
    )
    pager = []
    if query.before is not None:
        pager.append(f'<a href="{href(root, "", status=status, agent=query.agent)}">« newest</a>')
    if more:
        older = href(root, "", status=status, agent=query.agent, before=cursor(shown[-1]))
        pager.append(f'<a class="older" href="{older}">older »</a>')
    return f"""
<section class="filters">
{_chips(root, query)}
<form class="agent-filter" method="get" action="{esc(root)}">
  {f'<input type="hidden" name="status" value="{esc(status)}">' if status else ""}
  <label>agent <input name="agent" value="{esc(query.agent or "")}" placeholder="any"
    autocomplete="off"></label>
  <button type="submit">filter</button>
</form>
<form class="goto" method="get" action="{esc(root)}thread">
  <input name="id" placeholder="thread id" aria-label="thread id" required>
  <button type="submit">open</button>
</form>
</section>
<table class="threads">
<thead><tr><th>thread</th><th>agent</th><th>code</th><th>status</th><th>parent</th><th>updated</th>
<th>note</th></tr></thead>
<tbody>
{rows}
</tbody>
</table>
<nav class="pager">{" ".join(pager)}</nav>
"""


def _chips(root: str, query: ListQuery) -> str:
    chips = []
    for value in (None, *STATUSES):
        current = (query.status.value if query.status else None) == value
        link = href(root, "", status=value, agent=query.agent)
        label = value or "all"
        chips.append(
            f'<a class="chip{" on" if current else ""} c-{label}" href="{link}">{label}</a>'
        )
    return f'<nav class="chips" aria-label="status">{"".join(chips)}</nav>'


def _row(info: ThreadInfo, root: str, now: datetime) -> str:
    note = ""
    if info.last_error:
        note = f'<span class="error">{esc(short(info.last_error, 90))}</span>'
    elif info.closed_reason:
        note = f'<span class="muted">{esc(short(info.closed_reason, 90))}</span>'
    elif info.metadata.get("role"):
        note = f'<span class="muted">{esc(info.metadata["role"])}</span>'
    elif info.source_id is not None:
        kind = "replay" if info.tag else "fork"
        source = f'<a class="mono" href="{href(root, "thread", id=info.source_id)}">'
        note = f'<span class="muted">{kind} of {source}{esc(info.source_id)}</a></span>'
    parent = (
        f'<a class="mono" href="{href(root, "thread", id=info.parent_id)}">'
        f"{esc(info.parent_id)}</a>"
        if info.parent_id
        else '<span class="muted">—</span>'
    )
    return (
        f'<tr data-thread="{esc(info.id)}">'
        f'<td><a class="mono" href="{href(root, "thread", id=info.id)}">{esc(info.id)}</a></td>'
        f"<td>{esc(info.agent)}</td><td class='mono muted'>{esc(info.code_version)}</td>"
        f"<td>{badge(info.status.value)}</td><td>{parent}</td>"
        f"<td>{ago(info.updated_at, now)}</td><td>{note}</td></tr>"
    )
