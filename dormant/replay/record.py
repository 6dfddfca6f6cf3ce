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

from dormant.messages import (
    EVENT_TOOL_NAME,
    AssistantTurn,
    EventShown,
    ToolCall,
    ToolResult,
    UserText,
)
from dormant.stores.base import StoredItem
from dormant.tools.builtins import BUILTINS

__all__ = [
    "HELD_SUFFIXES",
    "INPUT_PREFIX",
    "SERVED_BUILTINS",
    "SLEEPS",
    "THREAD_BUILTINS",
    "Input",
    "Record",
    "call_key",
    "canonical",
]

SLEEPS = frozenset({"sleep", "sleep_until"})
"""A recorded timer's fire is served when the replay's model sleeps, instead of a wait as
long as the source's; a sleep the record lacks sets a timer of its own (nothing leaves)."""
THREAD_BUILTINS = frozenset({"spawn_thread", "send_message_to_child"})
"""Served from the record and never run: a child runs the real agent, its tools live. A
served ``spawn_thread`` names the source's child, and that child's recorded reports are
fed to it as events; a miss is a miss like any tool's (a built-in is never declared
``side_effect_free``, so ``on_miss="live"`` refuses it too)."""
SERVED_BUILTINS = SLEEPS | THREAD_BUILTINS
"""Built-ins a replay answers from the record too."""

HELD_SUFFIXES = (":interrupted", ":woken")
"""The message ids of a first result the runtime gave a call when the next input arrived
(user text interrupting it, an event waking a sleep): a replay holds such a call pending,
with nothing started, and the fed input answers it the same way."""

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


@dataclass(frozen=True)
class Input:
    """An outside input of the source: user text, or an event shown on one of its calls
    (a subscription's, ``original_call_id``)."""

    seq: int
    text: str
    original_call_id: str | None = None
    turns_before: int = 0
    """The source's model turns before it (after the fork point): inputs with no turn
    between them reached the model together, and are fed together."""


@dataclass
class Record:
    """The source's results by call key in call order, and its outside inputs in order."""

    results: dict[tuple[str, str], list[ToolResult]] = field(
        default_factory=lambda: defaultdict(list)
    )
    """The replay's n-th call of a key is served the n-th result, and stands for the
    source's call it answered (``ToolResult.call_id``): events on that call are fed to it."""
    inputs: list[Input] = field(default_factory=list)
    """After the fork point."""
    held: set[str] = field(default_factory=set)
    """The source's calls whose first result came with the next input (``HELD_SUFFIXES``):
    interrupted by user text (a late result may follow, as an event), or a sleep woken by
    an event."""

    @classmethod
    def of(cls, transcript: list[StoredItem], after_seq: int, match: str) -> Record:
        record = cls()
        calls: dict[str, ToolCall] = {}
        turns = 0
        for stored in transcript:
            if stored.seq <= after_seq:
                continue
            item = stored.item
            if isinstance(item, UserText):
                record.inputs.append(Input(stored.seq, item.text, None, turns))
            elif isinstance(item, EventShown):
                record.inputs.append(Input(stored.seq, item.content, item.original_call_id, turns))
            elif isinstance(item, AssistantTurn):
                turns += 1
                for c in item.calls:
                    if c.name in SERVED_BUILTINS or (
                        c.name != EVENT_TOOL_NAME and c.name not in BUILTINS
                    ):
                        calls[c.call_id] = c
            elif isinstance(item, ToolResult) and item.call_id in calls:
                made = calls.pop(item.call_id)  # the first result only
                record.results[call_key(made, match)].append(item)
                if stored.message_id in {f"{item.call_id}{s}" for s in HELD_SUFFIXES}:
                    record.held.add(item.call_id)
        return record

    def inputs_after(self, after_seq: int) -> list[Input]:
        """The recorded inputs after source seq ``after_seq``, in order."""
        return [i for i in self.inputs if i.seq > after_seq]
