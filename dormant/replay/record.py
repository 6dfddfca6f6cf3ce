"""What a replay serves from: the source's tool results and outside inputs after the fork.

Read from the source's whole transcript (``lineage.full_history``), so a compaction of the
source hides nothing. Built once per replay slice: a replay is background work, and the
source may still be growing.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dormant.messages import EVENT_TOOL_NAME, AssistantTurn, ToolCall, ToolResult, UserText
from dormant.stores.base import StoredItem
from dormant.tools.builtins import BUILTINS

__all__ = ["INPUT_PREFIX", "Record", "call_key", "canonical"]

INPUT_PREFIX = "replay:"
"""A fed input's message id is this and the source seq it was recorded at: a slice run
twice feeds nothing twice (the inbox's unique key), and the next one is found from it."""


def canonical(args: dict[str, Any]) -> str:
    """Arguments as one string, whatever their key order or spacing."""
    return json.dumps(args, sort_keys=True, separators=(",", ":"), default=str)


def call_key(call: ToolCall | tuple[str, dict[str, Any]], match: str) -> tuple[str, str]:
    """What two calls must share to be the same call (``ReplayTools.match``)."""
    name, args = (call.name, call.args) if isinstance(call, ToolCall) else call
    return (name, canonical(args) if match == "args" else "")


@dataclass
class Record:
    """The source's results by call key in call order, and its user text in order."""

    results: dict[tuple[str, str], list[ToolResult]] = field(
        default_factory=lambda: defaultdict(list)
    )
    inputs: list[tuple[int, str]] = field(default_factory=list)
    """(source seq, user text) after the fork point."""

    @classmethod
    def of(cls, transcript: list[StoredItem], after_seq: int, match: str) -> Record:
        record = cls()
        calls: dict[str, ToolCall] = {}
        for stored in transcript:
            if stored.seq <= after_seq:
                continue
            item = stored.item
            if isinstance(item, UserText):
                record.inputs.append((stored.seq, item.text))
            elif isinstance(item, AssistantTurn):
                for c in item.calls:
                    if c.name != EVENT_TOOL_NAME and c.name not in BUILTINS:
                        calls[c.call_id] = c
            elif isinstance(item, ToolResult) and item.call_id in calls:
                made = calls.pop(item.call_id)  # the first result only
                record.results[call_key(made, match)].append(item)
        return record

    def next_input(self, after_seq: int) -> tuple[int, str] | None:
        """The first recorded user text after source seq ``after_seq``."""
        return next(((s, t) for s, t in self.inputs if s > after_seq), None)
