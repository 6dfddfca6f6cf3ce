"""``Turn``: everything one slice will commit, built up step by step."""

from __future__ import annotations

from dataclasses import dataclass, field

from dormant.messages import Inbound, Item, Usage
from dormant.runtime.budgets import Meter
from dormant.stores.base import NewThread, NewTimer, StoredItem

__all__ = ["Turn"]


@dataclass
class Turn:
    """What the slice will commit, built up step by step."""

    next_seq: int
    items: list[StoredItem] = field(default_factory=list)
    outbox: list[tuple[str, str]] = field(default_factory=list)
    timers: list[NewTimer] = field(default_factory=list)
    threads: list[NewThread] = field(default_factory=list)
    enqueue: list[tuple[str, str, Inbound, int]] = field(default_factory=list)
    usage: Usage | None = None
    closing: bool = False
    meter: Meter | None = None
    """Set when the slice calls its model: what it spent, against the budget."""
    code_version: str = ""
    """The version of the agent that ran the slice (``Agent.fingerprint``)."""
    continues: bool = False
    """The slice ran out of rounds and queued results for itself: wake the thread again."""
    cancel_timers: list[str] = field(default_factory=list)
    """Call ids whose unfired timers go (approvals decided or interrupted)."""

    @property
    def free_seq(self) -> int:
        """The seq of the next item added."""
        return self.next_seq + len(self.items)

    def add(self, message_id: str, item: Item) -> StoredItem:
        stored = StoredItem(self.free_seq, message_id, item)
        self.items.append(stored)
        return stored
