"""The compact forms the memory store keeps an idle thread in.

- ``ItemLog``: the thread's items as JSON lines, compressed in chunks. Each chunk is raw
  deflate whose preset dictionary is the 32 KiB of text before it, ended by a sync flush,
  so appending a chunk costs only the new text, the whole log compresses about as well as
  one stream (a 20-turn thread of model text: ~3x at level 6, against ~2x for independent
  chunks), and the chunks read back as one stream, in one call. Every 64 KiB of text
  the stream starts again (a sealed segment), so the last lines read back in time that
  does not grow with the thread's length (a fork, ``runtime/forks.py``).
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
SEGMENT_BYTES = 64 * 1024
"""A segment of the item log is sealed at this much text: a read of the last lines
inflates at most about this much (and the tail)."""
SEED_BYTES = 16 * 1024
"""How much of the thread's first text a later segment's dictionary holds (``_seed``)."""
_PIECE_BYTES = SEGMENT_BYTES // 4
"""Text folded at a time (up to the end of a line): a long tail (a thread made with its
history) is folded in pieces, so it still seals a segment at every ``SEGMENT_BYTES``."""
_HEAD_BYTES = 24
"""Enough of a line for its seq (``rawitem.item_line``: the seq, then a tab)."""
MERGE_CHUNKS = 8
"""At this many chunks a fold joins them into one object (headers cost ~60 bytes a chunk,
about 1 KB a 20-turn thread; joining at every fold would leave a hole at every fold)."""


class ItemLog:
    """Append-only JSON lines: sealed segments, compressed chunks, a small raw tail.

    The compressed lines are one deflate stream per segment: a segment is sealed once it
    holds ``SEGMENT_BYTES`` of text, and the next starts again, its dictionary the first
    ``SEED_BYTES`` of the thread's text (``_seed``: the thread's own words, without the
    segment before it). Reading the last lines (a fork's look at its fork point) inflates the
    open segment and that much of the first, whatever the thread's length."""

    __slots__ = ("chunks", "folded", "sealed", "tail")

    def __init__(self) -> None:
        self.chunks: tuple[bytes, ...] = ()
        """Raw deflate data of the open segment: a few objects, each allocated at its final
        size. One growing buffer would leave a hole in the heap at every fold; one object a
        fold costs ~60 bytes of headers each and scatters a thread over many small blocks
        (measured: 4 MB more RSS for 450 idle 20-turn threads), so every ``MERGE_CHUNKS``
        folds join."""
        self.sealed: tuple[tuple[int, bytes], ...] = ()
        """The sealed segments, oldest first: how many lines each holds, and its deflate
        data in one object. Empty for any thread under 64 KiB of text."""
        self.folded = 0
        """Bytes of text in the open segment's chunks: it is sealed at ``SEGMENT_BYTES``."""
        self.tail = b""

    def append(self, lines: bytes) -> None:
        self.tail += lines

    def plaintext(self) -> tuple[bytes, bytes]:
        """Every line, and the window: the last ``WINDOW_BYTES`` of the open segment's
        stream (its dictionary, then its folded part)."""
        if not self.sealed:
            current = _inflate(b"".join(self.chunks), ITEM_FRAMING)
            return current + self.tail, (ITEM_FRAMING + current)[-WINDOW_BYTES:]
        first = _inflate(self.sealed[0][1], ITEM_FRAMING)
        seed = _seed(first)
        later = b"".join(_inflate(data, seed) for _, data in self.sealed[1:])
        current = _inflate(b"".join(self.chunks), seed)
        return first + later + current + self.tail, (seed + current)[-WINDOW_BYTES:]

    def text_from(self, line: int) -> bytes:
        """The lines from the start of the segment that holds line ``line`` (0 is the
        first) to the end: all of them, or the last few segments only."""
        start = skip = 0
        for count, _ in self.sealed:
            if start + count > line:
                break
            start += count
            skip += 1
        if skip == 0:
            return self.plaintext()[0]
        head = zlib.decompressobj(-15, zdict=ITEM_FRAMING)
        seed = _seed(head.decompress(self.sealed[0][1], SEED_BYTES))
        later = b"".join(_inflate(data, seed) for _, data in self.sealed[skip:])
        return later + _inflate(b"".join(self.chunks), seed) + self.tail

    def head(self) -> bytes:
        """The first few bytes of the first line (its seq), inflating no more than that."""
        data = self.sealed[0][1] if self.sealed else b"".join(self.chunks)
        if not data:
            return self.tail[:_HEAD_BYTES]
        return zlib.decompressobj(-15, zdict=ITEM_FRAMING).decompress(data, _HEAD_BYTES)

    def fold(self, window: bytes) -> bytes:
        """Compress the tail into a new chunk; ``window`` is what ``plaintext`` (or the
        previous fold) returned. Returns the window after the fold. A long tail (a thread
        made with its history) is folded a segment's worth of text at a time."""
        tail, self.tail = self.tail, b""
        while tail:
            cut = tail.find(b"\n", _PIECE_BYTES) + 1 or len(tail)
            self.tail, tail = tail[:cut], tail[cut:]
            window = self._fold(window)
        return window

    def _fold(self, window: bytes) -> bytes:
        if self.folded >= SEGMENT_BYTES:
            # Seal the open segment (counting its lines costs one inflate of it, once) and
            # start the next stream afresh, from the seed.
            data = b"".join(self.chunks)
            first = self.sealed[0][1] if self.sealed else data
            head = zlib.decompressobj(-15, zdict=ITEM_FRAMING).decompress(first, SEED_BYTES)
            text = _inflate(data, _seed(head) if self.sealed else ITEM_FRAMING)
            self.sealed = (*self.sealed, (text.count(b"\n"), data))
            self.chunks, self.folded, window = (), 0, _seed(head)
        self.folded += len(self.tail)
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
        sealed = sum(len(data) for _, data in self.sealed)
        return sealed + sum(map(len, self.chunks)) + len(self.tail)


def _inflate(data: bytes, dictionary: bytes) -> bytes:
    """One segment's text. Its chunks end in sync flushes, not final blocks, and each was
    compressed with the text before it as its dictionary: together they are one stream."""
    return zlib.decompressobj(-15, zdict=dictionary).decompress(data) if data else b""


def _seed(first: bytes) -> bytes:
    """The dictionary a segment after the first starts from: the framing, then the first
    ``SEED_BYTES`` of the thread's text (``first`` may run on). A 300-turn thread (413 KB
    of simulated model text) compressed 11 % worse than as one stream with the framing
    alone, 1.9 % worse with 16 KiB of its own first words, 0.2 % with 32 KiB; a read of
    the last lines inflates the seed too (16 KiB: about 15 us)."""
    return (ITEM_FRAMING + first[:SEED_BYTES])[-WINDOW_BYTES:]


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
