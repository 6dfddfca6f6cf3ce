"""``SimulatedModel``: realistic streamed completions of a set size, for benchmarks.

The text must cost what real model output costs once stored, or every memory figure is
meaningless: repetitive text compresses tenfold where real replies compress about threefold.
So the words come from a real vocabulary (``vocabulary.txt``: 4,000 English words ranked
by how many of Debian's licence texts and package docs use them, shipped with the package)
drawn with Zipf weights, in sentences of 5 to 18 words; each completion draws sentences
from a pool of ``_POOL`` per seed, which gives the phrase reuse of real prose. zlib at
level 6 compresses a whole 20-turn thread about 3x (``bench/workload.py`` checks it).

Each completion's text is a function of the seed, the thread and the history's length,
so it is the same whatever order threads run in, in any process.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from dormant.messages import EventShown, Item, ToolCall, ToolResult, Usage, UserText
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.stores.rawitem import ItemsView, item_kind, text_chars

__all__ = ["SimulatedModel", "simulated_text"]

_POOL = 1024
"""Sentences per seed: fewer repeat more (1024 gives about 3x under zlib, 4096 about 2.6x)."""


@functools.cache
def _vocabulary() -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The words, and cumulative Zipf weights by rank (``1 / (rank + 2)``)."""
    lines = resources.files("dormant.models").joinpath("vocabulary.txt").read_text()
    words = tuple(w for w in lines.split("\n") if w and not w.startswith("#"))
    weights = itertools.accumulate(1.0 / (rank + 2) for rank in range(len(words)))
    return words, tuple(weights)


@functools.cache
def _sentences(seed: int) -> tuple[str, ...]:
    words, cumulative = _vocabulary()
    rng = random.Random(seed)
    pool = []
    for _ in range(_POOL):
        drawn = rng.choices(words, cum_weights=cumulative, k=rng.randint(5, 18))
        if rng.random() < 0.3:
            at = rng.randrange(1, len(drawn))
            drawn[at] += ","
        text = " ".join(drawn)
        pool.append(text[0].upper() + text[1:] + rng.choice("......?:"))
    return tuple(pool)


def simulated_text(chars: int, seed: int, key: str) -> str:
    """``chars`` characters of prose, the same for the same ``(seed, key)``.

    The sentences are picked by a hash of the key (two bytes a pick), which costs a
    fraction of seeding and drawing from a ``random.Random`` per completion.
    """
    pool = _sentences(seed)
    parts: list[str] = []
    size = 0
    block = 0
    while size < chars:
        digest = hashlib.blake2b(f"{seed}:{key}:{block}".encode()).digest()
        for at in range(0, len(digest), 2):
            sentence = pool[int.from_bytes(digest[at : at + 2], "big") % _POOL]
            parts.append(sentence)
            size += len(sentence) + (1 if size else 0)  # the length of the joined text
            if size >= chars:
                break
        block += 1
    return " ".join(parts)[:chars]


@dataclass
class SimulatedModel:
    """Streams ``completion_chars`` of English-like text in ``chunk_chars`` pieces.

    Every ``call_every``-th user message is answered with a call to ``tool`` (0: never);
    ``chunk_delay_s`` simulates provider latency per chunk.
    """

    completion_chars: int = 1200
    chunk_chars: int = 48
    call_every: int = 0
    tool: str = "sleep"
    tool_args: dict[str, Any] = field(default_factory=lambda: {"seconds": 0})
    chunk_delay_s: float = 0.0
    name: str = "simulated"
    context_window: int = 200_000
    seed: int = 7

    def __post_init__(self) -> None:
        self._counter = itertools.count()

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        n = next(self._counter)
        users, prompt_chars = _measure(request.items)
        last = request.items[-1] if request.items else None
        calls: tuple[ToolCall, ...] = ()
        if self.call_every and isinstance(last, UserText) and users % self.call_every == 0:
            calls = (ToolCall(call_id=f"sim_{n}_{users}", name=self.tool, args=self.tool_args),)
        key = f"{request.thread_id}:{len(request.items)}"
        text = simulated_text(self.completion_chars, self.seed, key)
        for start in range(0, len(text), self.chunk_chars):
            if self.chunk_delay_s:
                time.sleep(self.chunk_delay_s)
            on_chunk(text[start : start + self.chunk_chars])
        return Completion(
            text=text,
            calls=calls,
            usage=Usage(input_tokens=prompt_chars // 4, output_tokens=len(text) // 4),
        )


def _measure(items: Sequence[Item]) -> tuple[int, int]:
    """How many items are user text, and the characters of text in all of them."""
    if isinstance(items, ItemsView):  # a slice's request: read the stored JSON, undecoded
        kinds = [item_kind(stored) for stored in items.stored]
        return kinds.count("user"), sum(map(text_chars, items.stored))
    users = chars = 0
    for item in items:  # by exact type: cheaper than isinstance on a union, per item
        kind = type(item)
        if kind is UserText:
            users += 1
            chars += len(item.text)  # type: ignore[union-attr]
        elif kind is ToolResult or kind is EventShown:
            chars += len(item.content)  # type: ignore[union-attr]
        else:  # an approval's items have no text the model reads
            chars += len(getattr(item, "text", ""))
    return users, chars
