"""Items kept as JSON until read (``dormant/stores/rawitem.py``) and the memory store's
use of them: a woken thread's slice decodes none of the history it only sends on."""

from __future__ import annotations

import pytest

from dormant.messages import (
    AssistantTurn,
    EventShown,
    Item,
    Summary,
    ToolCall,
    ToolResult,
    UserText,
)
from dormant.models.simulated import _measure
from dormant.runtime.failures import history_bytes_bound
from dormant.runtime.quarantine import history_bytes
from dormant.stores.base import NewThread, StoredItem
from dormant.stores.lineage import compacted
from dormant.stores.memory.store import MemoryStore
from dormant.stores.rawitem import (
    ItemsView,
    RawStoredItem,
    item_kind,
    item_line,
    parse_lines,
    text_chars,
)

ITEMS: list[Item] = [
    UserText(text="plain words"),
    UserText(text='quote " and tab \t and newline \n and é ünïcode ✓'),
    AssistantTurn(
        text="ascii reply", calls=(ToolCall(call_id="c1", name="t", args={"text": "x"}),)
    ),
    AssistantTurn(text="réponse", calls=()),
    ToolResult(call_id="c1", name="t", content="result \\ backslash"),
    ToolResult(call_id="c2", name="t", content="plain result"),
    EventShown(
        call_id="e1",
        original_call_id="c1",
        original_name="t",
        original_args={"content": "not this"},
        content="the event",
    ),
    Summary(text="so far", upto_seq=3),
]
MESSAGE_IDS = ["plain", 'quote "id"', "tab\tid", "ünï", "back\\slash", "m6", "m7", "m8"]


def stored_items() -> list[StoredItem]:
    return [
        StoredItem(n + 1, m, i) for n, (m, i) in enumerate(zip(MESSAGE_IDS, ITEMS, strict=True))
    ]


def raw_items() -> list[StoredItem]:
    return parse_lines(b"".join(map(item_line, stored_items())))


def test_lines_read_back_equal_and_undecoded() -> None:
    raw = raw_items()
    assert all(type(r) is RawStoredItem and r._decoded is None for r in raw)  # type: ignore[attr-defined]
    assert [item_kind(r) for r in raw] == [i.kind for i in ITEMS]
    assert [r.message_id for r in raw] == MESSAGE_IDS
    assert raw == stored_items() and stored_items() == raw
    assert [r.item for r in raw] == ITEMS


def test_text_chars_is_the_decoded_length() -> None:
    for raw, item in zip(raw_items(), ITEMS, strict=True):
        expected = len(item.content if isinstance(item, ToolResult | EventShown) else item.text)
        assert text_chars(raw) == expected, item


def test_the_model_measures_a_view_as_the_decoded_items() -> None:
    view = ItemsView(raw_items())
    assert _measure(view) == _measure(tuple(ITEMS))
    assert list(view) == ITEMS and view[-1] == ITEMS[-1] and list(view[1:3]) == ITEMS[1:3]
    assert view == tuple(ITEMS)


def test_history_bound_counts_a_raw_item_exactly() -> None:
    raw = raw_items()
    assert history_bytes_bound(raw) >= history_bytes(raw)
    assert history_bytes_bound(raw) < history_bytes_bound(stored_items())


def test_compaction_finds_the_summary_by_kind() -> None:
    raw = raw_items()
    assert [s.seq for s in compacted(raw)] == [8, 4, 5, 6, 7]


def test_a_woken_thread_loads_its_history_undecoded() -> None:
    store = MemoryStore()
    store.create_thread(NewThread("t", "a", items=stored_items()))
    snap = store.load("t")
    assert [s.seq for s in snap.items] == [8, 4, 5, 6, 7]  # the summary, what follows it
    assert all(type(s) is RawStoredItem for s in snap.items)
    # Only the summary was decoded (for what it covers): nothing else was read.
    assert [s._decoded is None for s in snap.items] == [False] + [True] * 4  # type: ignore[attr-defined]
    assert snap.items[-1].item == ITEMS[-2]


@pytest.mark.parametrize("message_id", MESSAGE_IDS)
def test_a_message_id_survives_the_line(message_id: str) -> None:
    line = item_line(StoredItem(1, message_id, UserText(text="x")))
    assert line.count(b"\n") == 1 and line.count(b"\t") == 3
    assert parse_lines(line)[0].message_id == message_id
