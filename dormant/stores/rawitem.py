"""Stored items kept as their JSON until something reads them.

A slice of a thread woken from idle needs its whole history for the model request, but
reads almost nothing of it: the kinds (where the latest summary is), the sizes (the
history bound) and, for the model, the text. Decoding every item into pydantic objects on
each wake was 23 % of all CPU in ``bench/workload.py dormant-memory``. ``RawStoredItem``
keeps an item's JSON and its kind and decodes the item only when ``item`` is read;
``ItemsView`` hands a history to a model as a ``Sequence[Item]`` that decodes the same
way, and lets the built-in models read the raw JSON instead (``text_chars``).

The memory store writes an item as one line, ``seq TAB kind TAB message_id TAB item``
(``item_line``), the message id and the item as JSON; JSON never holds a raw tab or
newline, so ``split`` finds the fields without parsing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any, overload

from dormant.messages import Item, ItemAdapter
from dormant.stores.base import StoredItem

__all__ = [
    "ItemsView",
    "RawStoredItem",
    "item_json",
    "item_kind",
    "item_line",
    "parse_lines",
    "text_chars",
]


class RawStoredItem(StoredItem):
    """A ``StoredItem`` whose ``item`` is decoded from ``raw`` on first read (then kept).

    ``raw`` is exactly ``ItemAdapter.dump_json(item)``, so its length is the item's size
    in ``history_bytes``. Equal to a ``StoredItem`` with the same fields.
    """

    __slots__ = ("_chars", "_decoded", "kind", "raw")

    kind: str
    raw: bytes
    _decoded: Item | None
    _chars: int
    """``text_chars``, once asked (-1 before): a request is measured every completion."""

    def __init__(self, seq: int, message_id: str, kind: str, raw: bytes) -> None:
        # StoredItem is a frozen dataclass: its own __init__ would assign ``item``.
        set_field = object.__setattr__
        set_field(self, "seq", seq)
        set_field(self, "message_id", message_id)
        set_field(self, "kind", kind)
        set_field(self, "raw", raw)
        set_field(self, "_decoded", None)
        set_field(self, "_chars", -1)

    @property  # read-only here; a dataclass field in StoredItem
    def item(self) -> Item:
        decoded = self._decoded
        if decoded is None:
            decoded = ItemAdapter.validate_json(self.raw)
            object.__setattr__(self, "_decoded", decoded)
        return decoded

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredItem):
            return NotImplemented
        return (self.seq, self.message_id, self.item) == (other.seq, other.message_id, other.item)

    def __hash__(self) -> int:
        return hash((self.seq, self.message_id, self.item))

    def __repr__(self) -> str:
        return (
            f"RawStoredItem(seq={self.seq!r}, message_id={self.message_id!r}, item={self.item!r})"
        )


def item_kind(stored: StoredItem) -> str:
    """The item's ``kind`` tag, without decoding a raw item."""
    if type(stored) is RawStoredItem:
        return stored.kind
    return stored.item.kind


def item_json(stored: StoredItem) -> bytes:
    """The item as ``ItemAdapter.dump_json`` writes it: a raw item's own bytes, undecoded."""
    if type(stored) is RawStoredItem:
        return stored.raw
    return ItemAdapter.dump_json(stored.item)


def item_line(stored: StoredItem) -> bytes:
    """One item as the memory store's line (see the module's docstring)."""
    message_id = json.dumps(stored.message_id, ensure_ascii=False).encode()
    kind = item_kind(stored).encode()
    return b"%d\t%s\t%s\t%s\n" % (stored.seq, kind, message_id, item_json(stored))


def parse_lines(text: bytes) -> list[StoredItem]:
    """The items of ``item_line`` lines, undecoded."""
    items: list[StoredItem] = []
    for line in text.split(b"\n"):
        if not line:
            continue
        seq, kind, message_id, raw = line.split(b"\t", 3)
        # Only an escape needs the JSON parser.
        mid = json.loads(message_id) if b"\\" in message_id else message_id[1:-1].decode()
        items.append(RawStoredItem(int(seq), mid, kind.decode(), raw))
    return items


_TEXT_FIELDS = {"user": b'"text":"', "assistant": b'"text":"', "summary": b'"text":"'}
_TEXT_FIELDS["tool_result"] = b'"content":"'
"""The string field a kind's text is in, where no object precedes it in the JSON (an
event's ``original_args`` come before its ``content``: it is decoded instead)."""


def text_chars(stored: StoredItem) -> int:
    """``len`` of the item's text (``text``, or ``content`` for a result or an event),
    read from the raw JSON when it has no escapes, else from the decoded item."""
    if type(stored) is RawStoredItem:
        if stored._chars < 0:
            object.__setattr__(stored, "_chars", _raw_text_chars(stored))
        return stored._chars
    return _decoded_text_chars(stored.item)


def _raw_text_chars(stored: RawStoredItem) -> int:
    key = _TEXT_FIELDS.get(stored.kind)
    raw = stored.raw
    if key is not None and b"\\" not in raw:  # no escapes: the next quote ends it
        start = raw.find(key)
        if start >= 0:
            start += len(key)
            text = raw[start : raw.index(b'"', start)]
            return len(text) if text.isascii() else len(text.decode())
    return _decoded_text_chars(stored.item)


def _decoded_text_chars(item: Any) -> int:
    """An approval item has no text the model reads: it counts 0."""
    if item.kind in ("tool_result", "event"):
        return len(item.content)
    return len(getattr(item, "text", ""))


class ItemsView(Sequence[Item]):
    """A history as a model request's items: each decoded when it is read.

    ``stored`` gives the built-in models the stored items themselves, to read the raw
    JSON (``text_chars``, ``item_kind``) instead of decoding what they only measure.
    """

    __slots__ = ("stored",)

    def __init__(self, stored: Sequence[StoredItem]) -> None:
        self.stored = tuple(stored)

    def __len__(self) -> int:
        return len(self.stored)

    @overload
    def __getitem__(self, index: int) -> Item: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Item]: ...

    def __getitem__(self, index: int | slice) -> Item | Sequence[Item]:
        if isinstance(index, slice):
            return ItemsView(self.stored[index])
        return self.stored[index].item

    def __iter__(self) -> Iterator[Item]:
        for stored in self.stored:
            yield stored.item

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ItemsView({list(self)!r})"
