"""One thread of the memory store: its compact bytes, its decoded form, and the moves between.

``StoredThread`` holds what an idle thread costs; ``Hot`` the objects a thread in use is
decoded into. The functions read a part from whichever form is current, so the store
never has to know which one it holds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import TypeAdapter

from dormant.messages import ToolResultMessage, UserMessage
from dormant.stores.base import (
    CallRecord,
    CallState,
    InboxRow,
    InboxState,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
)
from dormant.stores.memory.blob import ItemLog, SeenIds, pack_lines, unpack_lines
from dormant.stores.packing import pack, unpack
from dormant.stores.rawitem import item_line, parse_lines

__all__ = [
    "DONE_ROWS_KEPT",
    "FOLD_BYTES",
    "Codecs",
    "Framings",
    "Hot",
    "StoredThread",
    "add_to_tree",
    "calls_of",
    "codecs",
    "cool",
    "decode_items",
    "finish",
    "framings",
    "heat",
    "info_of",
    "now",
    "pack_calls",
    "pack_info",
    "set_calls",
    "status_of",
    "stored_thread",
    "update",
]

DONE_ROWS_KEPT = 8
"""Finished (done or rejected) inbox rows ``inbox()`` still shows, per thread."""

FOLD_BYTES = 2048
"""A cooling thread compresses its new items once they reach this size (less stays raw)."""


@dataclass(frozen=True, slots=True)
class Codecs:
    info: TypeAdapter[ThreadInfo]
    calls: TypeAdapter[dict[str, CallRecord]]
    row: TypeAdapter[InboxRow]


@functools.cache
def codecs() -> Codecs:
    """The adapters, built on first use: their schemas would cost every ``import dormant``."""
    return Codecs(
        TypeAdapter(ThreadInfo),
        TypeAdapter(dict[str, CallRecord]),
        TypeAdapter(InboxRow),
    )


@dataclass(frozen=True, slots=True)
class Framings:
    """Preset dictionaries of the small records (``packing.pack``): each one's JSON framing."""

    info: bytes
    calls: bytes
    rows: bytes


@functools.cache
def framings() -> Framings:
    """Empty records dumped as JSON, built on first use: only keys and fixed values, no
    thread's text; the timestamps are this process's start (the store lives no longer),
    so the dates of its records match them up to the minute."""
    c, at = codecs(), now().replace(second=0, microsecond=0)
    info = ThreadInfo("", "", ThreadStatus.IDLE, 0, created_at=at, updated_at=at)
    call = CallRecord("", "", {}, 0, CallState.ANSWERED)
    text = InboxRow(0, "", "", UserMessage(text=""), 8, InboxState.DONE, at)
    result = replace(text, message=ToolResultMessage(call_id="", content=""), priority=4)
    return Framings(
        c.info.dump_json(info),
        c.calls.dump_json({"": call}),
        c.row.dump_json(result) + b"\n" + c.row.dump_json(text),
    )


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True, eq=False)
class Hot:
    """A thread decoded for use; the bytes of ``StoredThread`` lag behind until it cools."""

    info: ThreadInfo
    items: list[StoredItem]
    calls: dict[str, CallRecord]
    done: list[bytes]
    window: bytes
    """The last 32 KiB of the compressed items' text: the next chunk's dictionary."""
    unsaved: int = 0
    """How many of the last ``items`` are not in the item log yet."""
    dirty: bool = False
    """Info, calls or finished rows changed since the thread was decoded."""


@dataclass(slots=True, eq=False)
class StoredThread:
    info: bytes
    """``ThreadInfo`` as JSON, packed (``packing.pack``)."""
    status: ThreadStatus
    """``info``'s status, kept beside it (8 bytes) so that a listing by status, such as
    ``run_until_idle``'s look for stalled threads, decodes only the threads it returns."""
    log: ItemLog = field(default_factory=ItemLog)
    calls: bytes = b""
    """The calls index, packed JSON (empty: no calls)."""
    ids: SeenIds = field(default_factory=SeenIds)
    """Every inbox message id ever accepted: the durable dedup set."""
    done: bytes = b""
    """The last finished inbox rows, packed JSON lines."""
    hot: Hot | None = None

    def seen(self, message_id: str) -> bool:
        return message_id in self.ids


# A thread's parts, from its decoded form if it is hot, else from its bytes ---------------


def info_of(t: StoredThread) -> ThreadInfo:
    if t.hot is not None:
        return t.hot.info
    return codecs().info.validate_json(unpack(t.info, framings().info))


def status_of(t: StoredThread) -> ThreadStatus:
    return t.hot.info.status if t.hot is not None else t.status


def stored_thread(info: ThreadInfo) -> StoredThread:
    """A new thread's bytes, with no items yet."""
    return StoredThread(pack_info(info), info.status)


def _set_info(t: StoredThread, info: ThreadInfo) -> None:
    t.info = pack_info(info)
    t.status = info.status


def update(t: StoredThread, **changes: Any) -> ThreadInfo:
    info = info_of(t)
    info = replace(info, version=info.version + 1, updated_at=now(), **changes)
    if t.hot is not None:
        t.hot.info = info
        t.hot.dirty = True
    else:
        _set_info(t, info)
    return info


def add_to_tree(t: StoredThread, tokens: int, cost: float) -> None:
    """Add to a root's tree totals, its version untouched (a child's commit)."""
    info = info_of(t)
    info = replace(info, tree_tokens=info.tree_tokens + tokens, tree_cost=info.tree_cost + cost)
    if t.hot is not None:
        t.hot.info = info
        t.hot.dirty = True
    else:
        _set_info(t, info)


def calls_of(t: StoredThread) -> dict[str, CallRecord]:
    """The calls index; a hot thread's own dict (changes to it are kept)."""
    if t.hot is not None:
        return t.hot.calls
    return codecs().calls.validate_json(unpack(t.calls, framings().calls)) if t.calls else {}


def set_calls(t: StoredThread, calls: dict[str, CallRecord]) -> None:
    if t.hot is not None:
        t.hot.calls = calls
        t.hot.dirty = True
    else:
        t.calls = pack_calls(calls)


def pack_calls(calls: dict[str, CallRecord]) -> bytes:
    return pack(codecs().calls.dump_json(calls), framings().calls) if calls else b""


def pack_info(info: ThreadInfo) -> bytes:
    return pack(codecs().info.dump_json(info), framings().info)


def decode_items(t: StoredThread) -> tuple[list[StoredItem], bytes]:
    """The thread's own items and its item log's window."""
    text, window = t.log.plaintext()
    # Undecoded: a slice decodes only the items it reads (``stores/rawitem.py``).
    return parse_lines(text), window


def finish(
    hot: Hot,
    open_rows: dict[int, InboxRow],
    row_id: int,
    state: InboxState,
    reason: str,
    trace: str = "",
) -> None:
    """Finish an open row; ``trace``, the applying slice's context, replaces the sender's."""
    row = open_rows.pop(row_id, None)
    if row is not None:
        reason = reason or row.reason  # a retried row keeps its quarantine story
        done = replace(row, state=state, reason=reason, trace=trace or row.trace)
        hot.done.append(codecs().row.dump_json(done))
        del hot.done[:-DONE_ROWS_KEPT]


def heat(t: StoredThread) -> Hot:
    """Decode the thread for use (its bytes stay as they are until it cools)."""
    items, window = decode_items(t)
    t.hot = Hot(info_of(t), items, calls_of(t), unpack_lines(t.done, framings().rows), window)
    return t.hot


def cool(t: StoredThread) -> None:
    """Write a decoded thread back to bytes (compressing its new items) and drop the objects."""
    hot = t.hot
    if hot is None:
        return
    if hot.unsaved:
        new = hot.items[len(hot.items) - hot.unsaved :]
        t.log.append(b"".join(map(item_line, new)))
    if len(t.log.tail) >= FOLD_BYTES:
        t.log.fold(hot.window)
    if hot.dirty:
        _set_info(t, hot.info)
        t.calls = pack_calls(hot.calls)
        t.done = pack_lines(hot.done, framings().rows)
    t.hot = None
