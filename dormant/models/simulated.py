"""``SimulatedModel``: realistic streamed completions of a set size, for benchmarks."""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Any

from dormant.messages import ToolCall, Usage, UserText
from dormant.models.base import ChunkSink, Completion, ModelRequest

__all__ = ["SimulatedModel"]

_TEXT = (
    "the build pipeline finished and every test passed except the flaky integration suite "
    "which timed out while waiting for the database container so I will retry it once and "
    "report back if it fails again meanwhile the pull request has two approvals and one "
    "comment asking to rename the configuration option before merging the release notes "
    "mention the new retry policy the deployment window opens tomorrow morning at nine and "
    "the on call engineer confirmed the rollback plan is ready"
)
_WORDS = _TEXT.split()


def _prose(chars: int, seed: int) -> str:
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < chars:
        sentence = rng.sample(_WORDS, rng.randint(6, 14))
        text = " ".join(sentence).capitalize() + "."
        words.append(text)
        size += len(text) + 1
    return " ".join(words)[:chars]


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
        self._texts = [_prose(self.completion_chars, self.seed + i) for i in range(16)]
        self._counter = itertools.count()

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        n = next(self._counter)
        users = sum(isinstance(item, UserText) for item in request.items)
        last = request.items[-1] if request.items else None
        calls: tuple[ToolCall, ...] = ()
        if self.call_every and isinstance(last, UserText) and users % self.call_every == 0:
            calls = (ToolCall(call_id=f"sim_{n}_{users}", name=self.tool, args=self.tool_args),)
        text = self._texts[n % len(self._texts)]
        for start in range(0, len(text), self.chunk_chars):
            if self.chunk_delay_s:
                time.sleep(self.chunk_delay_s)
            on_chunk(text[start : start + self.chunk_chars])
        prompt_chars = sum(
            len(getattr(item, "text", "") or getattr(item, "content", "")) for item in request.items
        )
        return Completion(
            text=text,
            calls=calls,
            usage=Usage(input_tokens=prompt_chars // 4, output_tokens=len(text) // 4),
        )
