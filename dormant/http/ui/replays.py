"""The page comparing the replays of a tag: each with its source, where it first
diverged, the calls served, missed and run live, and the two final answers side by side.

Replays are found among the newest ``SCAN_LIMIT`` threads by their tag (``threads.tag``):
a page for the experiment just run, not an archive (``dormant replay``'s JSON report is).
"""

from __future__ import annotations

from datetime import datetime

from dormant.http.ui.html import ago, badge, esc, href, short
from dormant.replay.diff import ReplayDiff, diff_threads
from dormant.stores.base import QueryStore, ThreadInfo

__all__ = ["SCAN_LIMIT", "replays_body"]

SCAN_LIMIT = 2000
"""The newest threads looked through for the tag's replays."""


def replays_body(store: QueryStore, tag: str, root: str, now: datetime) -> str:
    """The tag's replays, newest first, one row each, and their totals."""
    found = [i for i in store.threads(limit=SCAN_LIMIT) if i.tag == f"replay:{tag}"]
    diffs = [
        (info, diff_threads(store, info.metadata["replay"]["source"], info.id)) for info in found
    ]
    same = sum(d.same for _, d in diffs)
    rows = "".join(_row(info, d, root, now) for info, d in diffs) or (
        '<tr><td colspan="7" class="empty">No replays with this tag.</td></tr>'
    )
    return f"""<h1>replays <span class="mono">{esc(tag)}</span></h1>
<p class="totals">{len(diffs)} replays: {same} same, {len(diffs) - same} diverged</p>
<table class="threads replays"><thead><tr><th>replay</th><th>source</th><th>status</th>
<th>first divergence</th><th>served / missed / live</th><th>source answer</th>
<th>replay answer</th></tr></thead><tbody>{rows}</tbody></table>"""


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
