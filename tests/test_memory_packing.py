"""The memory store's small records packed with a preset dictionary of their framing, and
its item log starting from the item lines' framing (``dormant/stores/memory/blob.py``)."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime

from dormant.stores.base import ThreadInfo, ThreadStatus
from dormant.stores.memory.blob import ITEM_FRAMING, ItemLog
from dormant.stores.memory.thread import codecs, framings, pack_info
from dormant.stores.packing import pack, unpack


def test_thread_info_packs_to_a_fraction_of_its_json() -> None:
    at = datetime.now(UTC)
    info = ThreadInfo("thread-1", "agent", ThreadStatus.IDLE, 40, at, at, root_id="thread-1")
    raw = codecs().info.dump_json(info)
    packed = pack_info(info)
    assert codecs().info.validate_json(unpack(packed, framings().info)) == info
    # The framing is most of the record: well under zlib's own size for it.
    assert len(packed) * 2 < len(zlib.compress(raw, 9)), (len(packed), len(raw))


def test_pack_round_trips_any_bytes() -> None:
    for data in (b"", b"x", bytes(range(256)) * 40, b'{"a":1}\n' * 1000):
        assert unpack(pack(data, b'{"a":'), b'{"a":') == data


def test_item_log_reads_back_across_folds() -> None:
    log, window = ItemLog(), b""
    _, window = log.plaintext()
    assert window == ITEM_FRAMING
    lines = [b'%d\tuser\t"m%d"\t{"kind":"user","text":"turn %d"}\n' % (n, n, n) for n in range(300)]
    for at in range(0, 300, 30):
        log.append(b"".join(lines[at : at + 30]))
        window = log.fold(window)
    text, window = log.plaintext()
    assert text == b"".join(lines)
    assert window == (ITEM_FRAMING + text)[-len(window) :]
