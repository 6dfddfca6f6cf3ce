"""The agent a replay slice runs: the source's agent with the replay's model and
instructions, its tool calls answered from the record, its inputs fed one per turn.

The slice calls three functions of this module, each a no-op for any thread that is not a
replay: ``replayed`` (which agent runs), ``serve`` (a call answered from the record,
``runtime/calls.py``; a ``sleep`` too, with its recorded timer's fire, and the thread
tools, with the source's child) and ``feed`` (the next recorded input, queued with the
commit: user text, an event or a child's report on the call that stands for the source's,
a late result on the call the fed user text interrupted).
Nothing here sends anything out: a served call gets no outbox row, so no tool task,
deferred start, webhook, HTTP or MCP request exists for it; only a miss on a tool declared
``side_effect_free`` with ``on_miss="live"`` takes the ordinary path to its tool.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from dormant.agents import Agent
from dormant.messages import EventMessage, Inbound, ToolCall, ToolResultMessage, UserMessage
from dormant.replay.record import (
    INPUT_PREFIX,
    SERVED_BUILTINS,
    SLEEPS,
    Input,
    Record,
    call_key,
    canonical,
)
from dormant.replay.tools import MISS_PREFIX, ReplayTools
from dormant.runtime.children import CLOSED_REPORT
from dormant.runtime.history import LATE_RESULT
from dormant.stores.base import CallRecord, CallState, Priority, Snapshot, StoredItem, ThreadInfo
from dormant.stores.lineage import full_history
from dormant.tools.base import Tool

__all__ = ["REPLAY_KEY", "ReplayAgent", "Served", "feed", "replayed", "serve"]

REPLAY_KEY = "replay"
"""A replay's metadata key: its source, fork point, tag, overrides and ``ReplayTools``."""


class _Reader(Protocol):
    def thread(self, thread_id: str) -> ThreadInfo: ...

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]: ...


@dataclass(frozen=True)
class ReplayAgent(Agent):
    """An agent as a replay runs it (built per slice by ``replayed``)."""

    record: Record = field(default_factory=Record)
    replay_tools: ReplayTools = field(default_factory=ReplayTools)
    fork_seq: int = 0
    first_input_seq: int = 0


@dataclass(frozen=True)
class Served:
    """A call's answer from the record (or its miss); ``stop`` closes the replay."""

    content: str
    is_error: bool = False
    stop: bool = False
    subscribed: bool = False
    """The call takes more: a subscription's recorded events, a served spawn's reports."""
    held: bool = False
    """The source's call got its result only with the next input (interrupted by user
    text, a sleep woken by an event): left pending, nothing started, until that input is
    fed and answers it as it did the source's."""


def replayed(agent: Agent, thread: ThreadInfo, store: _Reader) -> Agent:
    """``agent`` as ``thread`` runs it: itself, unless the thread is a replay (told by its
    tag, which only ``start_replay`` writes, not by metadata a launch could carry)."""
    if thread.source_id is None or not (thread.tag or "").startswith("replay:"):
        return agent
    meta: dict[str, Any] = thread.metadata[REPLAY_KEY]
    tools = ReplayTools.from_stored(meta.get("tools") or {})
    source = store.thread(meta["source"])
    fork_seq = int(meta["fork_seq"])
    record = _record(store, source, fork_seq, tools.match)
    own = {f.name: getattr(agent, f.name) for f in dataclasses.fields(Agent)}
    if meta.get("model"):
        own["model"] = meta["model"]
    if meta.get("instructions") is not None:
        own["instructions"] = meta["instructions"]
    return ReplayAgent(
        **own,
        record=record,
        replay_tools=tools,
        fork_seq=fork_seq,
        first_input_seq=int(meta["from_seq"]),
    )


_RECORDS: OrderedDict[tuple[Any, ...], Record] = OrderedDict()
_RECORDS_KEPT = 64
"""Records kept by this process: a replay's slices, one per fed input, and a batch's
replays of one source read the source's whole transcript once, not once a slice."""
_records_lock = threading.Lock()


def _record(store: _Reader, source: ThreadInfo, fork_seq: int, match: str) -> Record:
    """The record of ``source`` after ``fork_seq``, built once for each version of the
    source (a source still growing gets a new record when it has committed more). Read
    only once built: ``serve`` and ``feed`` never change it."""
    key = (id(store), source.id, source.created_at, source.version, fork_seq, match)
    with _records_lock:
        record = _RECORDS.get(key)
        if record is not None:
            _RECORDS.move_to_end(key)
            return record
    record = Record.of(full_history(store, source), fork_seq, match)
    with _records_lock:
        _RECORDS[key] = record
        while len(_RECORDS) > _RECORDS_KEPT:
            _RECORDS.popitem(last=False)
    return record


def serve(agent: Agent, call: ToolCall, tool: Tool, calls: dict[str, CallRecord]) -> Served | None:
    """The answer to ``call`` from the record; None to start it as usual (not a replay,
    a built-in the record does not serve, or a live miss on a tool declared free of side
    effects)."""
    if not isinstance(agent, ReplayAgent):
        return None
    if tool.builtin and call.name not in SERVED_BUILTINS:
        return None
    recorded = agent.record.results.get(call_key(call, agent.replay_tools.match), [])
    earlier = _occurrence(agent, call.call_id, call_key(call, agent.replay_tools.match), calls)
    if earlier < len(recorded):
        result = recorded[earlier]
        takes_more = tool.subscription or call.name == "spawn_thread"
        return Served(
            result.content,
            result.is_error,
            subscribed=takes_more and not result.is_error,
            held=result.call_id in agent.record.held,
        )
    if call.name in SLEEPS:
        return None  # a sleep the source never made: a timer of its own, nothing sent out
    what = f"{call.name}({canonical(call.args)}) #{earlier + 1}"
    on_miss = agent.replay_tools.on_miss
    if on_miss == "live":
        if tool.side_effect_free:
            return None
        return Served(
            f"{MISS_PREFIX}{what}; not run live: {call.name} is not declared side_effect_free",
            is_error=True,
        )
    return Served(f"{MISS_PREFIX}{what}", is_error=True, stop=on_miss == "stop")


def _occurrence(
    agent: ReplayAgent, call_id: str, key: tuple[str, str], calls: dict[str, CallRecord]
) -> int:
    """How many of the replay's own calls before ``call_id`` share its key."""
    match = agent.replay_tools.match
    return sum(
        1
        for c in calls.values()
        if c.seq > agent.fork_seq
        and c.call_id != call_id
        and call_key((c.name, c.args), match) == key
    )


def _stands_for(agent: ReplayAgent, calls: dict[str, CallRecord]) -> dict[str, str]:
    """The source's call id each of the replay's served calls stands for."""
    match = agent.replay_tools.match
    seen: dict[tuple[str, str], int] = {}
    mapped: dict[str, str] = {}
    own = sorted((c for c in calls.values() if c.seq > agent.fork_seq), key=lambda c: c.seq)
    for c in own:
        key = call_key((c.name, c.args), match)
        n = seen[key] = seen.get(key, -1) + 1
        recorded = agent.record.results.get(key, [])
        if n < len(recorded):
            mapped[recorded[n].call_id] = c.call_id
    return mapped


def feed(
    agent: Agent,
    snap: Snapshot,
    turn_items: list[StoredItem],
    calls: dict[str, CallRecord],
    closing: bool,
) -> list[tuple[str, str, Inbound, int]]:
    """The replay's next recorded inputs, as messages for the commit to queue, once the
    model has answered everything before them (no call pending but those held for them):
    the next one, and those the source's model read with it (no model turn between them:
    two child reports that arrived together, say). An event or a child's report goes to
    the replay's call that stands for the source's call it came on, a late result to the
    interrupted call that stands for the source's; one whose call the replay never made
    (or no longer takes it) is left out."""
    if not isinstance(agent, ReplayAgent) or closing:
        return []
    mapped = _stands_for(agent, calls)
    held = {mapped[c] for c in agent.record.held if c in mapped}
    if any(c.state is CallState.PENDING and c.call_id not in held for c in calls.values()):
        return []
    fed = [
        int(s.message_id[len(INPUT_PREFIX) :])
        for s in [*snap.items, *turn_items]
        if s.seq > agent.fork_seq and s.message_id.startswith(INPUT_PREFIX)
    ]
    queued: list[tuple[str, str, Inbound, int]] = []
    together: int | None = None
    for nxt in agent.record.inputs_after(max(fed, default=agent.first_input_seq - 1)):
        if together is not None and nxt.turns_before != together:
            break
        message = _message(nxt, calls.get(mapped.get(nxt.original_call_id or "", "")))
        if message is not None:
            together = nxt.turns_before
            queued.append(
                (snap.thread.id, f"{INPUT_PREFIX}{nxt.seq}", message, Priority.BACKGROUND)
            )
    return queued


def _message(recorded: Input, ours: CallRecord | None) -> Inbound | None:
    """The message that shows ``recorded`` to the replay, on ``ours`` if it came on a call."""
    if recorded.original_call_id is None:
        return UserMessage(text=recorded.text)
    if ours is None:
        return None
    if ours.state is CallState.SUBSCRIBED:
        final = ours.name == "spawn_thread" and recorded.text.startswith(CLOSED_REPORT)
        return EventMessage(
            call_id=ours.call_id, content=recorded.text, associative=True, final=final
        )
    if ours.state is CallState.INTERRUPTED and recorded.text.startswith(LATE_RESULT):
        return ToolResultMessage(call_id=ours.call_id, content=recorded.text[len(LATE_RESULT) :])
    return None
