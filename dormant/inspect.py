"""What the CLI shows about threads: a tree of threads and a thread's timeline."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Group
from rich.text import Text
from rich.tree import Tree

from dormant.history import pending
from dormant.stores.base import CallState, InboxState, Store, ThreadInfo
from dormant.stores.lineage import full_history
from dormant.timeline import render_item

__all__ = ["thread_tree", "timeline"]

_STATUS_STYLE = {"idle": "green", "waiting": "yellow", "closed": "dim", "stalled": "bold red"}


def _label(store: Store, info: ThreadInfo) -> Text:
    snap = store.load(info.id)
    waiting = [c.name for c in pending(snap.calls)]
    own = (info.fork_seq or 0) if info.parent_id else -1  # inherited calls are the parent's
    live = [c.name for c in snap.calls.values() if c.state is CallState.SUBSCRIBED and c.seq > own]
    depth = sum(r.state is InboxState.PENDING for r in snap.inbox)
    deferred = len(snap.inbox) - depth
    label = Text.assemble(
        (info.id, "bold"),
        f"  {info.agent}  ",
        (info.status.value, _STATUS_STYLE.get(info.status.value, "")),
    )
    role = info.metadata.get("role")
    if role:
        label.append(f"  [{role}]", style="dim")
    if waiting:
        label.append(f"  waiting on {', '.join(waiting)}", style="yellow")
    if live:
        label.append(f"  subscribed to {', '.join(live)}", style="blue")
    if depth or deferred:
        label.append(f"  inbox {depth} pending, {deferred} deferred", style="magenta")
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
    lines: list[Text] = [_label(store, info), Text()]
    for stored in full_history(store, info) if full else store.history(thread_id):
        inherited = info.fork_seq is not None and stored.seq <= info.fork_seq
        line = Text.assemble((f"#{stored.seq:<4}", "dim"), render_item(stored.item))
        if inherited:
            line.stylize("dim")
        lines.append(line)
    return Group(*lines)
