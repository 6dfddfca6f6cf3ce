"""Compaction: when a history outgrows the model's context, summarise it up to a safe point.

The summary is an ordinary item at its own position (``Summary.upto_seq`` says what it
stands for); ``stores.lineage`` shows it in place of what it covers. A call is never split
from its result, so a pending call and everything after it stay visible.
"""

from __future__ import annotations

from dormant.agents import Agent
from dormant.messages import AssistantTurn, ToolResult
from dormant.models.base import Model
from dormant.stores.base import StoredItem, ThreadInfo

__all__ = ["COMPACTION_INSTRUCTIONS", "needs_compaction", "safe_seq"]

COMPACTION_INSTRUCTIONS = (
    "Summarise the conversation so far for your own future reference: the user's goals, "
    "decisions made, facts learned from tools and events, open questions and what you were "
    "about to do. Be specific (ids, names, numbers); omit pleasantries."
)


def safe_seq(items: list[StoredItem]) -> int | None:
    """The last position after which no call is waiting for its result (never splits a
    call from its result), or None if there is none."""
    open_calls: set[str] = set()
    safe: int | None = None
    for stored in sorted(items, key=lambda s: s.seq):
        item = stored.item
        if isinstance(item, AssistantTurn):
            open_calls.update(c.call_id for c in item.calls)
        elif isinstance(item, ToolResult):
            open_calls.discard(item.call_id)
        if not open_calls:
            safe = stored.seq
    return safe


def needs_compaction(agent: Agent, model: Model, thread: ThreadInfo) -> bool:
    return thread.usage.total_tokens > agent.compact_at * model.context_window
