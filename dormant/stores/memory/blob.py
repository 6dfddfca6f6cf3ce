"""The compact forms the memory store keeps an idle thread in.

- ``ItemLog``: the thread's items as JSON lines, compressed in chunks. Each chunk is raw
  deflate whose preset dictionary is the 32 KiB of text before it, ended by a sync flush,
  so appending a chunk costs only the new text, the whole log compresses about as well as
  one stream (a 20-turn thread of model text: ~3x at level 6, against ~2x for independent
  chunks), and the chunks read back as one stream, in one call.
- ``SeenIds``: every inbox message id the thread ever accepted, as 8-byte BLAKE2b
  digests (8 bytes an id instead of ~220 for a set entry); the durable dedup set.
- ``pack_lines`` / ``unpack_lines``: a small JSON record (the thread's info, its calls
  index, its last finished inbox rows) packed with a preset dictionary of the record's own
  framing (``stores/packing.py``, ``thread.framings``).

The item log's stream starts from ``ITEM_FRAMING``, the item lines' framing, as its
dictionary, so the first chunk of a thread compresses like the later ones.
"""

from __future__ import annotations

import zlib

from dormant.stores.digest import DIGEST_BYTES, message_digest
from dormant.stores.packing import ITEM_SKELETONS, LEVEL, pack, unpack

__all__ = ["ITEM_FRAMING", "ItemLog", "SeenIds", "pack_lines", "unpack_lines"]

WINDOW_BYTES = 32 * 1024
"""Deflate's window: a chunk sees at most this much of the text before it."""

MEM_LEVEL = 8
"""zlib's default: 9 cleared and filled twice the hash table at every fold (~13% more time
a fold) for the same output on model text, to the byte."""
ITEM_FRAMING = b"".join(b'0\t%s\t""\t%s\n' % skeleton for skeleton in ITEM_SKELETONS)
"""The item lines' framing (``stores/rawitem.py``), written by hand from the item models'
fields, no text of any thread: the dictionary the item log's stream starts from."""
MERGE_CHUNKS = 8
"""At this many chunks a fold joins them into one object (headers cost ~60 bytes a chunk,
about 1 KB a 20-turn thread; joining at every fold would leave a hole at every fold)."""


class ItemLog:
    """Append-only JSON lines: compressed chunks, then a small uncompressed tail."""

    __slots__ = ("chunks", "tail")

    def __init__(self) -> None:
        self.chunks: tuple[bytes, ...] = ()
        """Raw deflate data: a few objects, each allocated at its final size. One growing
        buffer would leave a hole in the heap at every fold; one object a fold costs ~60
        bytes of headers each and scatters a thread over many small blocks (measured: 4 MB
        more RSS for 450 idle 20-turn threads), so every ``MERGE_CHUNKS`` folds join."""
        self.tail = b""

    def append(self, lines: bytes) -> None:
        self.tail += lines

    def plaintext(self) -> tuple[bytes, bytes]:
        """Every line, and the window: the last ``WINDOW_BYTES`` of the stream's history
        (``ITEM_FRAMING``, then the folded part)."""
        # The chunks end in sync flushes, not final blocks, and each was compressed with
        # the text before it as its dictionary: together they are one deflate stream.
        inflate = zlib.decompressobj(-15, zdict=ITEM_FRAMING)
        text = inflate.decompress(b"".join(self.chunks))
        return text + self.tail, (ITEM_FRAMING + text[-WINDOW_BYTES:])[-WINDOW_BYTES:]

    def fold(self, window: bytes) -> bytes:
        """Compress the tail into a new chunk; ``window`` is what ``plaintext`` (or the
        previous fold) returned. Returns the window after the fold."""
        if not self.tail:
            return window
        strategy = zlib.Z_DEFAULT_STRATEGY
        deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, -15, MEM_LEVEL, strategy, window)
        data = deflate.compress(self.tail) + deflate.flush(zlib.Z_SYNC_FLUSH)
        if len(self.chunks) >= MERGE_CHUNKS:  # each object costs ~60 bytes of headers
            self.chunks = (b"".join((*self.chunks, data)),)
        else:
            self.chunks = (*self.chunks, data)
        window = (window + self.tail)[-WINDOW_BYTES:]
        self.tail = b""
        return window

    def nbytes(self) -> int:
        return sum(map(len, self.chunks)) + len(self.tail)


class SeenIds:
    """A set of message ids as 8-byte digests: a false "seen" needs a 64-bit collision
    within one thread (for a million ids, odds below one in ten million)."""

    __slots__ = ("digests",)

    def __init__(self) -> None:
        self.digests = b""

    def __contains__(self, message_id: str) -> bool:
        digest = message_digest(message_id)
        at = self.digests.find(digest)
        while at != -1:
            if at % DIGEST_BYTES == 0:  # a match across two digests is no match
                return True
            at = self.digests.find(digest, at + 1)
        return False

    def add(self, message_id: str) -> None:
        self.digests += message_digest(message_id)

    def nbytes(self) -> int:
        return len(self.digests)


def pack_lines(lines: list[bytes], framing: bytes) -> bytes:
    """JSON lines as one ``pack`` blob (empty for none)."""
    return pack(b"\n".join(lines), framing)


def unpack_lines(blob: bytes, framing: bytes) -> list[bytes]:
    return unpack(blob, framing).split(b"\n") if blob else []
