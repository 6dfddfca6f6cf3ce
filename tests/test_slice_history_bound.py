"""The history-size bound a slice checks first must never be below the exact size."""

from __future__ import annotations

from dormant.messages import AssistantTurn, EventShown, Summary, ToolCall, ToolResult, UserText
from dormant.runtime.failures import history_bytes_bound
from dormant.runtime.quarantine import history_bytes
from dormant.stores.base import StoredItem

AWKWARD = 'quote " backslash \\ control \x01\x1f newline \n tab \t non-ascii é 😀 </script>'


def _items() -> list[StoredItem]:
    call = ToolCall(
        call_id="c1",
        name="lookup",
        args={"q": AWKWARD, "n": [1, 2.5, None, True], "deep": {"x": {"y": AWKWARD * 3}}},
    )
    items = [
        UserText(text=AWKWARD),
        AssistantTurn(text=AWKWARD * 2, calls=(call, ToolCall(call_id="c2", name="empty"))),
        ToolResult(call_id="c1", name="lookup", content=AWKWARD, is_error=True),
        EventShown(
            call_id="e1",
            original_call_id="c1",
            original_name="lookup",
            original_args={"k": AWKWARD},
            content=AWKWARD,
        ),
        Summary(text=AWKWARD, upto_seq=123456789),
        UserText(text=""),
        AssistantTurn(),
    ]
    return [StoredItem(seq, f"m{seq}", item) for seq, item in enumerate(items, 1)]


def test_the_bound_is_at_least_the_exact_size_for_every_item_kind() -> None:
    for stored in _items():
        assert history_bytes_bound([stored]) >= history_bytes([stored]), stored.item.kind


def test_the_bound_of_a_history_is_at_least_its_exact_size() -> None:
    items = _items() * 50
    assert history_bytes(items) <= history_bytes_bound(items)
    assert history_bytes_bound([]) == 0
