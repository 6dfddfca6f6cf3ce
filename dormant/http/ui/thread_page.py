"""A thread's page: its state, what it waits for and since when, its children as a tree,
its timeline, and the live text of the turn being streamed."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime
from typing import Any
from urllib.parse import quote

from dormant.base_client import BaseClient
from dormant.budget import BUDGET_KEY
from dormant.errors import UnknownThread
from dormant.http.ui.html import ago, badge, esc, href, json_block, short
from dormant.messages import (
    ApprovalDecision,
    ApprovalRequest,
    AssistantTurn,
    ChildReport,
    EventMessage,
    EventShown,
    ParentMessage,
    Summary,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    UserMessage,
    UserText,
)
from dormant.ops.inspect import thread_record
from dormant.ops.usage import thread_usage
from dormant.runtime.history import pending
from dormant.stores.base import (
    CallRecord,
    InboxRow,
    InboxState,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
)
from dormant.tracing.links import trace_chain

__all__ = ["MAX_TREE_NODES", "thread_body", "thread_state"]

MAX_TREE_NODES = 200
"""A tree larger than this is cut (each child's page shows its own subtree)."""


def thread_body(
    client: BaseClient,
    info: ThreadInfo,
    *,
    root: str,
    now: datetime,
    full: bool,
    actions: str,
    stream_url: str | None,
) -> str:
    """Everything below the top bar; ``actions`` is the rendered action forms (or "")."""
    store = client.store
    record = thread_record(store, info)
    snap = store.load(info.id)
    calls = snap.calls
    items = client.stored_history(info.id, full=full)
    last_seq = max((s.seq for s in items), default=0)
    traces = _trace_links(client, info.id)
    timeline = "".join(_item(s, info, calls, traces.get(s.message_id)) for s in items)
    timeline += "".join(_queued(row) for row in snap.inbox)
    view = (
        f'<a href="{href(root, "thread", id=info.id)}">model view</a> · <b>full transcript</b>'
        if full
        else f'<b>model view</b> · <a href="{href(root, "thread", id=info.id, full="1")}">'
        "full transcript</a>"
    )
    state_url = href(root, "thread/state", id=info.id)
    live = (
        f'<div id="live" class="live" data-stream="{esc(stream_url)}" data-last-seq="{last_seq}"'
        f' data-state="{state_url}">'
        '<div class="bubble assistant streaming" hidden><span class="who">assistant'
        ' <em>streaming…</em></span><div class="text"></div></div>'
        '<p class="stream-state muted"></p></div>'
        if stream_url
        else ""
    )
    return f"""
<section class="head">
  <h1 class="mono">{esc(info.id)}</h1>
  <div class="facts" id="facts">{_facts(info, now)}</div>
  <div id="problems">{_problems(info)}</div>
  {actions}
</section>
<div class="columns">
<section class="timeline" aria-label="timeline">
  <h2>Timeline <small>{view}</small></h2>
  <ol class="items" id="items">{timeline or '<li class="empty">No items yet.</li>'}</ol>
  {live}
</section>
<aside class="side" id="side">{_side(client, info, record, calls, root, now)}</aside>
</div>
"""


def thread_state(
    client: BaseClient, info: ThreadInfo, *, root: str, now: datetime
) -> dict[str, Any]:
    """What the live view refreshes while the page is open (``thread/state?id=``): the
    stream says what happened, not what the store made of it (an interrupted call, a
    cancelled subscription, a child's status, a message still in the inbox), so the page
    asks the store. Parts are rendered as on the page; ``calls`` maps call ids to states."""
    snap = client.store.load(info.id)
    record = thread_record(client.store, info)
    return {
        "status": info.status.value,
        "facts": _facts(info, now),
        "problems": _problems(info),
        "side": _side(client, info, record, snap.calls, root, now),
        "calls": {call_id: call.state.value for call_id, call in snap.calls.items()},
        "queued": "".join(_queued(row) for row in snap.inbox),
    }


def _facts(info: ThreadInfo, now: datetime) -> str:
    return (
        f"{badge(info.status.value)} <span>agent <b>{esc(info.agent)}</b></span>"
        f" <span>created {ago(info.created_at, now)}</span>"
        f" <span>updated {ago(info.updated_at, now)}</span>"
        f" <span>code <b class='mono'>{esc(info.code_version or 'unrecorded')}</b></span>"
        f" <span class='muted'>commit {info.version}</span>"
    )


def _side(
    client: BaseClient,
    info: ThreadInfo,
    record: dict[str, object],
    calls: dict[str, CallRecord],
    root: str,
    now: datetime,
) -> str:
    held = {
        p.call_id for p in client.pending_approvals(root_id=info.root_id) if p.thread_id == info.id
    }
    return (
        _waiting(record, calls, info, now, held, root)
        + _usage(client, info)
        + _tree(client, info, root)
        + _versions(client, info)
        + _metadata(info)
    )


def _problems(info: ThreadInfo) -> str:
    parts = []
    if info.last_error:
        failures = f"{info.failures} failure{'s' if info.failures != 1 else ''}"
        parts.append(f'<div class="alert"><b>{failures}</b><pre>{esc(info.last_error)}</pre></div>')
    if info.closed_reason:
        parts.append(f'<p class="muted">closed: {esc(info.closed_reason)}</p>')
    return "".join(parts)


def _waiting(
    record: dict[str, object],
    calls: dict[str, CallRecord],
    info: ThreadInfo,
    now: datetime,
    held: set[str],
    root: str,
) -> str:
    rows = []
    if info.status is not ThreadStatus.CLOSED:
        for call in pending(calls):
            since = ago(info.updated_at, now)
            what = (
                f'<a href="{esc(root)}approvals?root={quote(info.root_id, safe="")}">'
                "awaiting approval</a>"
                if call.call_id in held
                else "waiting"
            )
            rows.append(
                f'<li class="wait"><b>{esc(call.name)}</b> <code>{esc(call.call_id)}</code>'
                f'<br><span class="muted">{esc(short(_args(call.args), 80))}</span>'
                f'<br><span class="muted">{what}, unchanged since {since}</span></li>'
            )
    for name in record["subscribed_to"]:  # type: ignore[attr-defined]
        rows.append(f'<li class="sub">subscribed to <b>{esc(name)}</b></li>')
    inbox_pending, inbox_deferred = record["inbox_pending"], record["inbox_deferred"]
    if inbox_pending or inbox_deferred:
        rows.append(f"<li>inbox: {inbox_pending} pending, {inbox_deferred} deferred</li>")
    for message_id in record["quarantined"]:  # type: ignore[attr-defined]
        rows.append(f'<li class="bad">quarantined message <code>{esc(message_id)}</code></li>')
    for child in record["stalled_children"]:  # type: ignore[attr-defined]
        child_id = child["id"]
        link = f'<a class="mono" href="{href(root, "thread", id=child_id)}">{esc(child_id)}</a>'
        rows.append(
            f'<li class="bad">child {link} ({esc(child["agent"])}) stalled:'
            f" {esc(short(child['last_error'], 160))}</li>"
        )
    body = "".join(rows) or '<li class="muted">nothing: no call pending, inbox empty</li>'
    return f'<section class="card"><h3>Waiting for</h3><ul class="plain">{body}</ul></section>'


def _usage(client: BaseClient, info: ThreadInfo) -> str:
    """The thread's own spend (its ledger), its completions since the last user message,
    and on a root the tree's totals and the tree's own budget (``dormant show`` says the
    same)."""
    spend = thread_usage(client.store, info)
    if not spend.completions and not info.usage.total_tokens:
        return ""
    rows = [
        ("completions", f"{spend.completions:,}"),
        ("tokens in", f"{spend.input_tokens:,}"),
        ("tokens out", f"{spend.output_tokens:,}"),
        ("cached", f"{spend.cached_tokens:,}"),
        ("cost", f"{spend.cost:.4f}"),
        ("since user text", f"{info.message_completions:,} completions"),
    ]
    if info.parent_id is None:
        rows.append(("tree tokens", f"{info.tree_tokens:,}"))
        rows.append(("tree cost", f"{info.tree_cost:.4f}"))
        own = info.metadata.get(BUDGET_KEY)
        limits = ", ".join(f"{k} {v}" for k, v in own.items()) if own else "the agent's"
        rows.append(("budget", limits))
    body = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in rows)
    return f'<section class="card"><h3>Usage</h3><dl class="usage">{body}</dl></section>'


def _tree(client: BaseClient, info: ThreadInfo, root: str) -> str:
    """The thread's family: its root's tree, this thread marked (cut at MAX_TREE_NODES)."""
    store = client.store
    top = info
    if info.root_id and info.root_id != info.id:
        with contextlib.suppress(UnknownThread):  # a root pruned before its children
            top = store.thread(info.root_id)
    budget = [MAX_TREE_NODES]

    def node(t: ThreadInfo) -> str:
        budget[0] -= 1
        me = " me" if t.id == info.id else ""
        label = (
            f'<a class="mono{me}" href="{href(root, "thread", id=t.id)}">{esc(t.id)}</a> '
            f"{badge(t.status.value)} <span class='muted'>{esc(t.agent)}</span>"
        )
        kids = store.children(t.id) if budget[0] > 0 else []
        inner = "".join(node(k) for k in kids if budget[0] > 0)
        return f"<li>{label}{f'<ul>{inner}</ul>' if inner else ''}</li>"

    tree = node(top)
    if top.id == info.id and not store.children(info.id):
        return ""
    cut = '<p class="muted">(cut: open a child for its subtree)</p>' if budget[0] <= 0 else ""
    return f'<section class="card"><h3>Threads</h3><ul class="tree">{tree}</ul>{cut}</section>'


def _versions(client: BaseClient, info: ThreadInfo) -> str:
    """Once a deploy met the thread: the versions of the agent that ran it, newest first,
    each with the items it made (docs/upgrades.md)."""
    spans = client.store.version_spans(info.id)
    if len(spans) == 1:  # one version ran it all: the header says which
        return ""
    ends = [later.from_seq - 1 for later in spans[1:]] + [None]
    rows = []
    for span, end in reversed(list(zip(spans, ends, strict=True))):
        items = f"#{span.from_seq} on" if end is None else f"#{span.from_seq} to #{end}"
        name = esc(span.code_version or "unrecorded")
        rows.append(f"<dt class='mono'>{name}</dt><dd>{items}</dd>")
    body = "".join(rows)
    return f'<section class="card"><h3>Code versions</h3><dl class="usage">{body}</dl></section>'


def _metadata(info: ThreadInfo) -> str:
    if not info.metadata:
        return ""
    return f'<section class="card"><h3>Metadata</h3>{json_block(info.metadata)}</section>'


def _args(args: dict[str, object]) -> str:
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())


def _call(call: ToolCall, calls: dict[str, CallRecord]) -> str:
    record = calls.get(call.call_id)
    state = record.state.value if record else "unknown"
    return (
        f'<li class="call c-{esc(state)}" data-call="{esc(call.call_id)}">'
        f'<span class="fn">{esc(call.name)}</span>'
        f'(<span class="args">{esc(short(_args(call.args), 160))}</span>) '
        f'<span class="state">{esc(state)}</span> <code>{esc(call.call_id)}</code></li>'
    )


def _queued(row: InboxRow) -> str:
    """A message in the inbox, not yet applied: it joins the history with the next commit."""
    state = "deferred" if row.state is InboxState.DEFERRED else "queued"
    match row.message:
        case UserMessage(text=text):
            who, text, kind = "user", text, "user"
        case ToolResultMessage(call_id=call_id, content=text):
            who, kind = f"result for <code>{esc(call_id)}</code>", "tool_result"
        case (
            EventMessage(call_id=call_id, content=text)
            | ChildReport(call_id=call_id, content=text)
            | ParentMessage(call_id=call_id, content=text)
        ):
            who, kind = f"{esc(row.message.kind)} on <code>{esc(call_id)}</code>", "event"
        case ApprovalDecision(call_id=call_id, decision=decision, by=by):
            who, kind = f"decision on <code>{esc(call_id)}</code>", "event"
            text = f"{decision} by {by}"
    return (
        f'<li class="bubble {kind} queued" data-inbox="{row.id}">'
        f'<span class="seq">{state}</span><span class="who">{who} <em>{state}</em></span>'
        f'<div class="text">{esc(short(text, 2000))}</div></li>'
    )


def _trace_links(client: BaseClient, thread_id: str) -> dict[str, str]:
    """Message id -> the URL of the trace of the slice that applied it, when
    ``trace_url_template`` is set (only then is the inbox read for them)."""
    template = client.settings.trace_url_template
    if not template:
        return {}
    chain = trace_chain(client.store, thread_id, template)
    return {m.message_id: m.url for m in chain if m.url}


def _item(
    stored: StoredItem, info: ThreadInfo, calls: dict[str, CallRecord], trace: str | None = None
) -> str:
    inherited = info.fork_seq is not None and stored.seq <= info.fork_seq
    cls = " inherited" if inherited else ""
    seq = f'<span class="seq">#{stored.seq}</span>'
    if trace is not None:  # the slice that applied this message, in the trace viewer
        seq += f'<a class="trace" href="{esc(trace)}" rel="noopener" target="_blank">trace</a>'
    match stored.item:
        case UserText(text=text):
            body = f'<span class="who">user</span><div class="text">{esc(text)}</div>'
            kind = "user"
        case AssistantTurn(text=text, calls=turn_calls):
            listed = "".join(_call(c, calls) for c in turn_calls)
            body = (
                '<span class="who">assistant</span>'
                + (f'<div class="text">{esc(text)}</div>' if text else "")
                + (f'<ul class="calls">{listed}</ul>' if listed else "")
            )
            kind = "assistant"
        case ToolResult(name=name, content=content, is_error=is_error, call_id=call_id):
            kind = "tool_result error" if is_error else "tool_result"
            body = (
                f'<span class="who">result of <b>{esc(name)}</b> <code>{esc(call_id)}</code>'
                f'</span><div class="text">{esc(content)}</div>'
            )
        case EventShown(original_name=name, original_call_id=call_id, content=content):
            kind = "event"
            body = (
                f'<span class="who">event on <b>{esc(name)}</b> <code>{esc(call_id)}</code>'
                f'</span><div class="text">{esc(content)}</div>'
            )
        case Summary(text=text, upto_seq=upto):
            kind = "summary"
            body = (
                f'<span class="who">summary up to #{upto}</span><div class="text">{esc(text)}</div>'
            )
        case ApprovalRequest(name=name, call_id=call_id, args=args, digest=digest):
            kind = "event"
            body = (
                f'<span class="who">approval asked for <b>{esc(name)}</b> '
                f'<code>{esc(call_id)}</code></span><div class="text">'
                f"{esc(json.dumps(args, sort_keys=True))} (digest {esc(digest)})</div>"
            )
        case ApprovalDecision(call_id=call_id, decision=decision, by=by, channel=channel) as made:
            kind = "event"
            why = f": {made.reason}" if made.reason else ""
            body = (
                f'<span class="who">{esc(decision)} <code>{esc(call_id)}</code> by {esc(by)} '
                f'via {esc(channel)}</span><div class="text">{esc(why)}</div>'
            )
    return f'<li class="bubble {kind}{cls}" data-seq="{stored.seq}">{seq}{body}</li>'
