"""The memory store keeps idle threads compact without losing anything the contract promises.

Compressed items (chained deflate chunks), the dedup set as digests, a bounded number of
finished inbox rows, and a bounded cache of decoded threads.
"""

from __future__ import annotations

import json
import random

import pytest

from dormant.errors import DuplicateMessage
from dormant.messages import AssistantTurn, ToolCall, UserMessage, UserText
from dormant.models.simulated import simulated_text
from dormant.stores.base import (
    CallRecord,
    CallState,
    Commit,
    InboxState,
    NewThread,
    Priority,
    StoredItem,
    ThreadStatus,
)
from dormant.stores.memory import blob
from dormant.stores.memory.blob import WINDOW_BYTES, ItemLog, SeenIds
from dormant.stores.memory.store import MemoryStore
from dormant.stores.memory.thread import DONE_ROWS_KEPT


def turn(store: MemoryStore, thread_id: str, n: int, status: ThreadStatus) -> None:
    """One turn: a user message consumed, a ~1.2 KB assistant reply with a call."""
    row = store.enqueue(thread_id, f"m{n}", UserMessage(text=f"turn {n}"), Priority.INTERACTIVE)
    snap = store.load(thread_id)
    reply = AssistantTurn(
        text=simulated_text(1200, 7, f"{thread_id}:{n}"),
        calls=(ToolCall(call_id=f"c{n}", name="run_build", args={"target": "main"}),),
    )
    items = [
        StoredItem(snap.next_seq, f"m{n}", UserText(text=f"turn {n}")),
        StoredItem(snap.next_seq + 1, f"turn:{n}", reply),
    ]
    call = CallRecord(
        f"c{n}", "run_build", {"target": "main"}, snap.next_seq + 1, CallState.PENDING
    )
    commit = Commit(
        thread_id=thread_id,
        version=snap.thread.version,
        status=status,
        inbox_seen=row.id,
        items=items,
        calls=[call],
        done=[row.id],
    )
    assert store.commit(commit) is not None


def test_an_idle_thread_keeps_its_items_compressed_and_reads_them_back_exactly() -> None:
    store = MemoryStore()
    store.create_thread(NewThread(id="t", agent="a"))
    for n in range(30):
        turn(store, "t", n, ThreadStatus.IDLE)  # idle after every turn: cooled every time
    items = store.own_items("t")
    assert [s.message_id for s in items] == [m for n in range(30) for m in (f"m{n}", f"turn:{n}")]
    assert items[-1].item.text == simulated_text(1200, 7, "t:29")  # type: ignore[union-attr]
    raw = sum(len(json.dumps(s.item.model_dump())) for s in items)
    assert raw > 36_000  # more than one deflate window: later chunks use a dictionary
    assert store.stored_bytes("t") < raw / 2
    assert store.load("t").next_seq == 61
    assert len(store.call("t", "c0").args) == 1


def test_a_waiting_thread_stays_decoded_and_an_idle_one_does_not() -> None:
    store = MemoryStore()
    for thread_id in ("waits", "idles"):
        store.create_thread(NewThread(id=thread_id, agent="a"))
    turn(store, "waits", 0, ThreadStatus.WAITING)
    turn(store, "idles", 0, ThreadStatus.IDLE)
    assert list(store._hot) == ["waits"]


def test_the_decoded_cache_is_bounded_and_an_evicted_thread_loses_nothing() -> None:
    store = MemoryStore(max_hot_threads=2)
    threads = [f"t{i}" for i in range(5)]
    for thread_id in threads:
        store.create_thread(NewThread(id=thread_id, agent="a"))
    for n in range(3):
        for thread_id in threads:
            turn(store, thread_id, n, ThreadStatus.WAITING)
            assert len(store._hot) <= 2
    for thread_id in threads:
        snap = store.load(thread_id)
        assert [s.seq for s in snap.items] == [1, 2, 3, 4, 5, 6]
        assert sorted(snap.calls) == ["c0", "c1", "c2"]
        assert snap.thread.status is ThreadStatus.WAITING


def test_finished_rows_are_bounded_but_every_id_stays_a_duplicate() -> None:
    store = MemoryStore()
    store.create_thread(NewThread(id="t", agent="a"))
    for n in range(DONE_ROWS_KEPT + 5):
        turn(store, "t", n, ThreadStatus.IDLE)
    done = store.inbox("t", InboxState.DONE)
    assert [r.message_id for r in done] == [f"m{n}" for n in range(5, DONE_ROWS_KEPT + 5)]
    with pytest.raises(DuplicateMessage):
        store.enqueue("t", "m0", UserMessage(text="again"), Priority.INTERACTIVE)
    assert store.seen("t", "m0") and not store.seen("t", "never-sent")


def test_the_item_log_reads_back_every_fold_across_the_window() -> None:
    rng = random.Random(3)
    log, window, expected = ItemLog(), b"", b""
    for n in range(40):
        line = (simulated_text(rng.randrange(200, 3000), 7, str(n)) + "\n").encode()
        log.append(line)
        expected += line
        if n % 3 == 2:
            window = log.fold(window)
    text, read_window = log.plaintext()
    assert text == expected
    assert len(expected) > 2 * WINDOW_BYTES
    assert read_window == window
    assert log.nbytes() < len(expected) / 2


def test_seen_ids_match_whole_digests_only() -> None:
    ids = SeenIds()
    for n in range(1000):
        ids.add(f"message-{n}")
    assert all(f"message-{n}" in ids for n in range(1000))
    assert not any(f"other-{n}" in ids for n in range(1000))
    assert ids.nbytes() == 8000


def test_a_listing_by_status_decodes_only_the_threads_it_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dormant.stores.memory import thread as stored

    store = MemoryStore()
    for n in range(6):
        store.create_thread(NewThread(id=f"t{n}", agent="a"))
        turn(store, f"t{n}", 1, ThreadStatus.WAITING)
    store.set_status("t1", ThreadStatus.STALLED)  # cold: its bytes are rewritten
    store.load("t4")  # hot: its decoded info is read
    store.set_status("t4", ThreadStatus.STALLED)
    decoded: list[str] = []
    info_of = stored.info_of

    def counting(t: stored.StoredThread) -> object:
        info = info_of(t)
        decoded.append(info.id)
        return info

    monkeypatch.setattr(stored, "info_of", counting)
    assert sorted(i.id for i in store.threads(ThreadStatus.STALLED)) == ["t1", "t4"]
    assert sorted(decoded) == ["t1", "t4"]
    store.set_status("t1", ThreadStatus.WAITING)
    assert [i.id for i in store.threads(ThreadStatus.STALLED)] == ["t4"]
    assert len(store.threads(ThreadStatus.WAITING)) == 5


def _inflated(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the bytes of text the item log inflates from now on."""
    counted: list[int] = []
    real = blob.zlib.decompressobj

    class Counting:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self._inflate = real(*args, **kwargs)  # type: ignore[arg-type]

        def decompress(self, data: bytes, max_length: int = 0) -> bytes:
            out = self._inflate.decompress(data, max_length)
            counted.append(len(out))
            return out

    monkeypatch.setattr(blob.zlib, "decompressobj", Counting)
    return counted


def test_the_last_items_of_a_long_idle_thread_read_back_inflating_one_segment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fork reads its source's items around its fork point: on a cold memory thread of
    10,000 items that inflates no more text than on one of 100 (a segment's worth)."""
    store = MemoryStore()
    for size in (100, 10_000):
        items = [
            StoredItem(s, f"m{s}", UserText(text=f"question {s}: is build {s} green yet?"))
            for s in range(1, size + 1)
        ]
        store.create_thread(NewThread(id=f"t{size}", agent="a", items=items))
    assert store.stored_bytes("t10000") < 500_000 / 4  # made compressed, not left raw
    counted = _inflated(monkeypatch)
    for size in (100, 10_000):
        counted.clear()
        window = store.own_items_between(f"t{size}", size - 8, size)
        assert [s.seq for s in window] == list(range(size - 7, size + 1))
        assert sum(counted) <= 2 * blob.SEGMENT_BYTES, (size, sum(counted))


def test_a_segmented_item_log_reads_back_every_window_exactly() -> None:
    store = MemoryStore()
    store.create_thread(NewThread(id="t", agent="a"))
    for n in range(120):  # ~1.3 KB a turn, cooled after each: folds seal segments
        turn(store, "t", n, ThreadStatus.IDLE)
    items = [StoredItem(s.seq, s.message_id, s.item) for s in store.own_items("t")]  # decoded, once
    assert len(store._threads["t"].log.sealed) >= 2
    assert [s.seq for s in items] == list(range(1, 241))
    rng = random.Random(5)
    for _ in range(60):
        after = rng.randrange(0, 240)
        upto = rng.randrange(after, 241)
        assert store.own_items_between("t", after, upto) == items[after:upto]
    assert store.own_items_between("t", 230, 260) == items[230:]
