"""The memory store's usage ledger, compact: per thread, packed binary entries, one per
minute in which the thread used its model (SQL keeps a row per slice; ``--since`` then
has a resolution of a minute here).

An entry per slice as Python tuples cost about 16 KB of resident memory per agent after
40 completions (``bench/workload.py dormant-memory``: 381 KB an idle agent instead of
363 KB); packed and folded by minute, an agent that talks for a minute keeps 48 bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from datetime import datetime

from dormant.stores.base import Spend

__all__ = ["MemoryLedger"]

_ENTRY = struct.Struct("<qqqqqd")
"""(minute since the epoch, completions, input, output, cached tokens, cost)."""
_MINUTE_S = 60


class MemoryLedger:
    """Entries by thread; the caller (the store) holds its lock."""

    def __init__(self) -> None:
        self._entries: dict[str, bytearray] = {}
        self._agents: dict[str, str] = {}

    def add(self, thread_id: str, agent: str, at: datetime, spend: Spend) -> None:
        minute = int(at.timestamp()) // _MINUTE_S
        packed = self._entries.get(thread_id)
        if packed is None:
            packed = self._entries[thread_id] = bytearray()
            self._agents[thread_id] = agent
        last = len(packed) - _ENTRY.size
        if last >= 0:
            was, completions, input_tokens, output_tokens, cached, cost = _ENTRY.unpack_from(
                packed, last
            )
            if was == minute:  # the same minute: add to its entry, in place
                _ENTRY.pack_into(
                    packed,
                    last,
                    minute,
                    completions + spend.completions,
                    input_tokens + spend.input_tokens,
                    output_tokens + spend.output_tokens,
                    cached + spend.cached_tokens,
                    cost + spend.cost,
                )
                return
        packed += _ENTRY.pack(
            minute,
            spend.completions,
            spend.input_tokens,
            spend.output_tokens,
            spend.cached_tokens,
            spend.cost,
        )

    def drop(self, thread_ids: Iterable[str]) -> None:
        """Forget pruned threads' entries."""
        for thread_id in thread_ids:
            self._entries.pop(thread_id, None)
            self._agents.pop(thread_id, None)

    def usage(
        self, thread_id: str | None, agent: str | None, since: datetime | None
    ) -> dict[str, Spend]:
        after = since.timestamp() / _MINUTE_S if since is not None else None
        totals: dict[str, Spend] = {}
        for tid, packed in self._entries.items():
            name = self._agents[tid]
            if (thread_id is not None and tid != thread_id) or (
                agent is not None and name != agent
            ):
                continue
            for entry in _ENTRY.iter_unpack(packed):
                if after is None or entry[0] >= after:
                    totals[name] = totals.get(name, Spend()) + _spend(entry)
        return dict(sorted(totals.items()))


def _spend(entry: tuple[int, int, int, int, int, float]) -> Spend:
    return Spend(entry[1], entry[2], entry[3], entry[4], entry[5])
