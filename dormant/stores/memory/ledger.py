"""The memory store's usage ledger, compact: per thread, packed binary entries, one per
minute in which the thread used its model (SQL keeps a row per slice; ``--since`` then
has a resolution of a minute here).

An entry per slice as Python tuples cost about 16 KB of resident memory per agent after
40 completions (``bench/workload.py dormant-memory``: 381 KB an idle agent instead of
363 KB); packed and folded by minute, an agent that talks for a minute keeps 48 bytes.

``MemorySpending`` is mixed into ``MemoryStore``: a commit's spend goes into the ledger and
onto its root's tree totals; ``usage`` reads the ledger back, under the store's lock.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from dormant.stores.base import Spend, ThreadInfo
from dormant.stores.memory import thread as stored
from dormant.stores.records import usage_key

__all__ = ["MemoryLedger", "MemorySpending"]

_ENTRY = struct.Struct("<qqqqqd")
"""(minute since the epoch, completions, input, output, cached tokens, cost)."""
_MINUTE_S = 60


class MemoryLedger:
    """Entries by thread; the caller (the store) holds its lock."""

    def __init__(self) -> None:
        self._entries: dict[str, bytearray] = {}
        self._agents: dict[str, tuple[str, str | None]] = {}
        """Each thread's agent and tag (a replay's usage is summed apart, ``usage_key``)."""

    def add(
        self, thread_id: str, agent: str, at: datetime, spend: Spend, tag: str | None = None
    ) -> None:
        minute = int(at.timestamp()) // _MINUTE_S
        packed = self._entries.get(thread_id)
        if packed is None:
            packed = self._entries[thread_id] = bytearray()
            self._agents[thread_id] = (agent, tag)
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
            of, tag = self._agents[tid]
            if (thread_id is not None and tid != thread_id) or (agent is not None and of != agent):
                continue
            name = usage_key(of, tag)
            for entry in _ENTRY.iter_unpack(packed):
                if after is None or entry[0] >= after:
                    totals[name] = totals.get(name, Spend()) + _spend(entry)
        return dict(sorted(totals.items()))


def _spend(entry: tuple[int, int, int, int, int, float]) -> Spend:
    return Spend(entry[1], entry[2], entry[3], entry[4], entry[5])


class MemorySpending:
    _lock: threading.RLock
    _threads: dict[str, stored.StoredThread]
    _ledger: MemoryLedger

    def _get(self, thread_id: str) -> stored.StoredThread:
        raise NotImplementedError

    def usage(
        self,
        *,
        thread_id: str | None = None,
        agent: str | None = None,
        since: datetime | None = None,
    ) -> dict[str, Spend]:
        with self._lock:
            if thread_id is not None:
                self._get(thread_id)
            return self._ledger.usage(thread_id, agent, since)

    def _add_spend(
        self, info: ThreadInfo, spend: Spend, now: datetime, changes: dict[str, Any]
    ) -> None:
        """A ledger entry, and the tokens and cost on the root's tree totals: through
        ``changes`` for a root's own commit; else on the root's record as it is, its
        version untouched (a root's slice must not go stale for its child's commit)."""
        self._ledger.add(info.id, info.agent, now, spend, info.tag)
        root_id = info.root_id or info.id
        if root_id == info.id:
            changes["tree_tokens"] = info.tree_tokens + spend.tokens
            changes["tree_cost"] = info.tree_cost + spend.cost
            return
        root = self._threads.get(root_id)
        if root is not None:
            stored.add_to_tree(root, spend.tokens, spend.cost)
