"""What the CLI shows about threads: a tree of threads and a thread's timeline, as text
for people and as JSON records (``--json``) for scripts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.text import Text
from rich.tree import Tree

from dormant.messages import ItemAdapter
from dormant.ops.timeline import render_item
from dormant.ops.usage import spend_record, thread_usage, usage_line
from dormant.runtime.history import pending
from dormant.stores.base import (
    CallState,
    InboxState,
    Store,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
    VersionSpan,
)
from dormant.stores.lineage import full_history

__all__ = [
    "thread_record",
    "thread_records",
    "thread_tree",
    "timeline",
    "timeline_record",
    "version_records",
    "versions_line",
]

_STATUS_STYLE = {"idle": "green", "waiting": "yellow", "closed": "dim", "stalled": "bold red"}


@dataclass(frozen=True)
class _State:
    """What a thread is doing now, beyond its status."""

    waiting: list[str]
    subscribed: list[str]
    inbox_pending: int
    inbox_deferred: int
    quarantined: list[str]
    """Ids of the thread's quarantined (poison) messages."""
    stalled_children: list[ThreadInfo]
    """Children that stalled: the parent may be idle, waiting for their reports, and this
    says why nothing comes (``dormant retry CHILD`` re-drives one)."""


def _state(store: Store, info: ThreadInfo) -> _State:
    snap = store.load(info.id)
    own = (info.fork_seq or 0) if info.parent_id else -1  # inherited calls are the parent's
    depth = sum(r.state is InboxState.PENDING for r in snap.inbox)
    return _State(
        waiting=[c.name for c in pending(snap.calls)],
        subscribed=[
            c.name for c in snap.calls.values() if c.state is CallState.SUBSCRIBED and c.seq > own
        ],
        inbox_pending=depth,
        inbox_deferred=len(snap.inbox) - depth,
        quarantined=[r.message_id for r in store.inbox(info.id, InboxState.QUARANTINED)],
        stalled_children=[c for c in store.children(info.id) if c.status is ThreadStatus.STALLED],
    )


def _label(store: Store, info: ThreadInfo) -> Text:
    state = _state(store, info)
    waiting, live = state.waiting, state.subscribed
    depth, deferred = state.inbox_pending, state.inbox_deferred
    label = Text.assemble(
        (info.id, "bold"),
        f"  {info.agent}  ",
        (info.status.value, _STATUS_STYLE.get(info.status.value, "")),
    )
    role = info.metadata.get("role")
    if role:
        label.append(f"  [{role}]", style="dim")
    if info.source_id is not None:
        kind = "replay" if info.tag else "fork"
        label.append(f"  [{kind} of {info.source_id} at {info.fork_seq}]", style="dim")
    if waiting:
        label.append(f"  waiting on {', '.join(waiting)}", style="yellow")
    if live:
        label.append(f"  subscribed to {', '.join(live)}", style="blue")
    if depth or deferred:
        label.append(f"  inbox {depth} pending, {deferred} deferred", style="magenta")
    if state.quarantined:
        label.append(f"  quarantined: {', '.join(state.quarantined)}", style="bold red")
    for child in state.stalled_children:
        label.append(f"  child {child.id} stalled: {child.last_error}", style="bold red")
    if info.closed_reason:
        label.append(f"  ({info.closed_reason})", style="dim")
    if info.last_error:
        label.append(f"\n{info.last_error}", style="red")
    return label


def thread_tree(store: Store, threads: Iterable[ThreadInfo]) -> Tree:
    """Roots newest first, each with its descendants (children oldest first)."""
    tree = Tree("threads", hide_root=True)
    listed = list(threads)
    ids = {t.id for t in listed}

    def add(node: Tree, info: ThreadInfo) -> None:
        branch = node.add(_label(store, info))
        for child in store.children(info.id):
            add(branch, child)

    for info in listed:
        if info.parent_id is None or info.parent_id not in ids:
            add(tree, info)
    return tree


def timeline(store: Store, thread_id: str, *, full: bool = False) -> Group:
    """The thread's status, then its model-visible history (``full``: every stored item,
    including those a summary replaced), inherited items dimmed."""
    info = store.thread(thread_id)
    spans = store.version_spans(thread_id)
    lines: list[Text] = [_label(store, info), usage_line(store, info), versions_line(spans)]
    lines.append(Text())
    starts = {span.from_seq: span for span in spans[1:]}
    for stored in _items(store, info, full):
        inherited = info.fork_seq is not None and stored.seq <= info.fork_seq
        if stored.seq in starts:
            lines.append(Text(f"----- version {starts.pop(stored.seq).code_version} -----", "cyan"))
        line = Text.assemble((f"#{stored.seq:<4}", "dim"), render_item(stored.item))
        if inherited:
            line.stylize("dim")
        lines.append(line)
    return Group(*lines)


def versions_line(spans: list[VersionSpan]) -> Text:
    """``version v2 (v1 until #13)``: the version that runs the thread now, and the ones
    that ran it before a deploy met it."""
    *before, now = spans
    text = Text.assemble("version ", (now.code_version or "unrecorded", "cyan"))
    if before:
        ends = [later.from_seq - 1 for later in spans[1:]]
        earlier = ", ".join(
            f"{span.code_version or 'unrecorded'} until #{end}"
            for span, end in zip(before, ends, strict=False)
        )
        text.append(f" ({earlier})", style="dim")
    return text


def version_records(spans: list[VersionSpan]) -> list[dict[str, Any]]:
    return [
        {"from_seq": s.from_seq, "code_version": s.code_version, "since": s.since.isoformat()}
        for s in spans
    ]


def thread_record(store: Store, info: ThreadInfo) -> dict[str, Any]:
    """One thread as JSON-ready data: what ``dormant threads`` shows, field by field."""
    state = _state(store, info)
    return {
        "id": info.id,
        "agent": info.agent,
        "status": info.status.value,
        "parent_id": info.parent_id,
        "parent_call_id": info.parent_call_id,
        "root_id": info.root_id,
        "role": info.metadata.get("role"),
        "source_id": info.source_id,
        "fork_seq": info.fork_seq,
        "tag": info.tag,
        "waiting_on": state.waiting,
        "subscribed_to": state.subscribed,
        "inbox_pending": state.inbox_pending,
        "inbox_deferred": state.inbox_deferred,
        "quarantined": state.quarantined,
        "stalled_children": [
            {"id": c.id, "agent": c.agent, "last_error": c.last_error}
            for c in state.stalled_children
        ],
        "failures": info.failures,
        "last_error": info.last_error,
        "closed_reason": info.closed_reason,
        "version": info.version,
        "code_version": info.code_version,
        "created_at": info.created_at.isoformat(),
        "updated_at": info.updated_at.isoformat(),
        "metadata": info.metadata,
        "usage": spend_record(thread_usage(store, info)),
        "message_completions": info.message_completions,
        "tree_tokens": info.tree_tokens,
        "tree_cost": info.tree_cost,
    }


def thread_records(store: Store, threads: Iterable[ThreadInfo]) -> list[dict[str, Any]]:
    """The threads of ``thread_tree`` in the same order (each root, then its descendants
    depth first), flat: ``parent_id`` says where each one hangs."""
    listed = list(threads)
    ids = {t.id for t in listed}
    records: list[dict[str, Any]] = []

    def add(info: ThreadInfo) -> None:
        records.append(thread_record(store, info))
        for child in store.children(info.id):
            add(child)

    for info in listed:
        if info.parent_id is None or info.parent_id not in ids:
            add(info)
    return records


def timeline_record(store: Store, thread_id: str, *, full: bool = False) -> dict[str, Any]:
    """``dormant show --json``: the thread and its model-visible items (``full``: every
    stored item), each as stored."""
    info = store.thread(thread_id)
    items = [
        {
            "seq": stored.seq,
            "inherited": info.fork_seq is not None and stored.seq <= info.fork_seq,
            "message_id": stored.message_id or None,
            "item": ItemAdapter.dump_python(stored.item, mode="json"),
        }
        for stored in _items(store, info, full)
    ]
    versions = version_records(store.version_spans(thread_id))
    return {"thread": thread_record(store, info), "versions": versions, "items": items}


def _items(store: Store, info: ThreadInfo, full: bool) -> list[StoredItem]:
    """What the model sees, or (``full``) every stored item, summaries' originals included."""
    return full_history(store, info) if full else store.history(info.id)
