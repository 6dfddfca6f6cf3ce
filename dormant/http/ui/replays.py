"""The page comparing the replays of a tag: each with its source, where it first
diverged, the calls served, missed and run live, and the two final answers side by side.

Replays are found by their tag (``threads.tag``, indexed: migration 0015), newest first,
``PAGE_SIZE`` a page (keyset paging like the thread list): a tag's replays of any age,
each page diffed on its own. ``dormant replay``'s JSON report holds a batch's totals.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from dormant.http.ui.html import ago, badge, esc, href, short
from dormant.http.ui.listing import PAGE_SIZE, ListQuery, cursor
from dormant.replay.diff import ReplayDiff, diff_threads
from dormant.stores.base import QueryStore, ThreadInfo

__all__ = ["replays_body"]


def replays_body(
    store: QueryStore, tag: str, root: str, now: datetime, query: Mapping[str, str] | None = None
) -> str:
    """One page of the tag's replays, newest first, one row each, the page's totals and
    the link to the next page (``query``'s ``before``: ``MalformedMessage`` if no cursor)."""
    before = ListQuery.parse({"before": (query or {}).get("before", "")}).before
    found = store.threads(limit=PAGE_SIZE + 1, tag=f"replay:{tag}", before=before)
    shown, more = found[:PAGE_SIZE], len(found) > PAGE_SIZE
    diffs = [
        (info, diff_threads(store, info.metadata["replay"]["source"], info.id)) for info in shown
    ]
    same = sum(d.same for _, d in diffs)
    rows = "".join(_row(info, d, root, now) for info, d in diffs) or (
        '<tr><td colspan="7" class="empty">No replays with this tag.</td></tr>'
    )
    paged = before is not None or more
    pager = []
    if before is not None:
        pager.append(f'<a href="{href(root, "replays", tag=tag)}">« newest</a>')
    if more:
        older = href(root, "replays", tag=tag, before=cursor(shown[-1]))
        pager.append(f'<a class="older" href="{older}">older »</a>')
    counted = f"{len(diffs)} replays{' on this page' if paged else ''}"
    return f"""<h1>replays <span class="mono">{esc(tag)}</span></h1>
<p class="totals">{counted}: {same} same, {len(diffs) - same} diverged</p>
<table class="threads replays"><thead><tr><th>replay</th><th>source</th><th>status</th>
<th>first divergence</th><th>served / missed / live</th><th>source answer</th>
<th>replay answer</th></tr></thead><tbody>{rows}</tbody></table>
<nav class="pager">{" ".join(pager)}</nav>"""


def _row(info: ThreadInfo, d: ReplayDiff, root: str, now: datetime) -> str:
    first = d.first_divergence
    where = (
        "same"
        if first is None
        else f"step {first.step}: {esc(short(first.source, 60))} → {esc(short(first.replay, 60))}"
    )
    link = href(root, "thread", id=info.id)
    source = href(root, "thread", id=d.source_id)
    return (
        f'<tr data-same="{str(d.same).lower()}"><td><a class="mono" href="{link}">'
        f"{esc(info.id)}</a> {ago(info.created_at, now)}</td>"
        f'<td><a class="mono" href="{source}">{esc(d.source_id)}</a></td>'
        f"<td>{badge(info.status.value)}</td><td>{where}</td>"
        f"<td>{d.served} / {d.missed} / {d.live}</td>"
        f"<td>{esc(short(d.source_answer))}</td><td>{esc(short(d.replay_answer))}</td></tr>"
    )
