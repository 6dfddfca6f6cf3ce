"""The memory store's usage ledger: one entry per committed slice that called its model,
as compact tuples by thread (what ``ledger`` rows are in SQL)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from dormant.stores.base import Spend

__all__ = ["MemoryLedger"]

_Entry = tuple[float, int, int, int, int, float]
"""(at as a POSIX timestamp, completions, input, output, cached tokens, cost)."""


class MemoryLedger:
    """Entries by thread; the caller (the store) holds its lock."""

    def __init__(self) -> None:
        self._entries: dict[str, list[_Entry]] = {}
        self._agents: dict[str, str] = {}

    def add(self, thread_id: str, agent: str, at: datetime, spend: Spend) -> None:
        self._agents[thread_id] = agent
        entry = (
            at.timestamp(),
            spend.completions,
            spend.input_tokens,
            spend.output_tokens,
            spend.cached_tokens,
            spend.cost,
        )
        self._entries.setdefault(thread_id, []).append(entry)

    def drop(self, thread_ids: Iterable[str]) -> None:
        """Forget pruned threads' entries."""
        for thread_id in thread_ids:
            self._entries.pop(thread_id, None)
            self._agents.pop(thread_id, None)

    def usage(
        self, thread_id: str | None, agent: str | None, since: datetime | None
    ) -> dict[str, Spend]:
        after = since.timestamp() if since is not None else None
        totals: dict[str, Spend] = {}
        for tid, entries in self._entries.items():
            name = self._agents[tid]
            if (thread_id is not None and tid != thread_id) or (
                agent is not None and name != agent
            ):
                continue
            for at, completions, input_tokens, output_tokens, cached, cost in entries:
                if after is None or at >= after:
                    spent = Spend(completions, input_tokens, output_tokens, cached, cost)
                    totals[name] = totals.get(name, Spend()) + spent
        return dict(sorted(totals.items()))
