"""Child threads: spawning, event threads, reports to the parent, closing.

A child stores only its own items and inherits its parent's history up to ``fork_seq``.
Everything here only adds to the ``Turn`` the slice commits: a child, its first
message, a report to the parent and the cancellations of a closing thread are written in
the same transaction as the turn that caused them.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from dormant.agents import Agent
from dormant.messages import (
    AssistantTurn,
    ChildReport,
    EventMessage,
    ToolCall,
    ToolResult,
    ToolResultMessage,
)
from dormant.runtime.compaction import safe_seq
from dormant.runtime.history import Applied, EventSpawn
from dormant.runtime.turn import Turn
from dormant.stores.base import (
    CallRecord,
    CallState,
    NewThread,
    Priority,
    Snapshot,
    StoredItem,
    ThreadInfo,
)
from dormant.stores.closing import streams_to_stop

__all__ = [
    "CLOSED_REPORT",
    "EVENT_SEED_PREFIX",
    "SEED_PREFIX",
    "close_thread",
    "instructions_for",
    "new_thread_id",
    "report_to_parent",
    "spawn_child",
    "spawn_event_thread",
]


SEED_PREFIX = "seed:"
"""The message id of a spawned child's first message (``seed:<spawn call id>``): its
trace links to the parent's slice rather than continuing it (``dormant.tracing``)."""
EVENT_SEED_PREFIX = "event:"
"""A threaded event's seed in its temporary child has the message id of the subscriber's
row, with this prefix (``dormant check`` follows an event there)."""


CLOSED_REPORT = "Child thread "
"""How a closing child's final report starts (then its id and ``closed.``): its parent's
spawn call takes no more reports after it (a replay feeds it as final)."""


def new_thread_id() -> str:
    return f"thr_{uuid.uuid4().hex[:20]}"


def spawn_child(
    agent: Agent,
    thread: ThreadInfo,
    call: ToolCall,
    seq: int,
    instructions: str,
    turn: Turn,
) -> str:
    """A child forked at the spawning turn: it owes results for that turn's other calls."""
    child_id = new_thread_id()
    spawning = next(s.item for s in turn.items if s.seq == seq)
    assert isinstance(spawning, AssistantTurn)
    others = [c for c in spawning.calls if c.call_id != call.call_id]
    owed = [
        StoredItem(
            seq + 1 + i,
            f"{c.call_id}:parent",
            ToolResult(
                call_id=c.call_id,
                name=c.name,
                content=f"(handled by the parent thread {thread.id})",
            ),
        )
        for i, c in enumerate(others)
    ]
    spawn_call = CallRecord(
        call.call_id, call.name, call.args, seq, CallState.PENDING, subscription=True
    )
    known = [spawn_call] + [
        CallRecord(c.call_id, c.name, c.args, seq, CallState.ANSWERED) for c in others
    ]
    turn.threads.append(
        NewThread(
            id=child_id,
            agent=agent.name,
            parent_id=thread.id,
            parent_call_id=call.call_id,
            fork_seq=seq,
            root_id=thread.root_id,
            metadata={"role": "child", "instructions": instructions},
            items=owed,
            calls=known,
        )
    )
    seed = ToolResultMessage(
        call_id=call.call_id,
        content=(
            f"You are now inside child thread {child_id}, spawned by thread {thread.id}. "
            f"Your task: {instructions}\n"
            "Report with report_to_parent; finish with close_thread."
        ),
    )
    turn.enqueue.append((child_id, f"{SEED_PREFIX}{call.call_id}", seed, Priority.BACKGROUND))
    return child_id


def spawn_event_thread(agent: Agent, snap: Snapshot, turn: Turn, spawn: EventSpawn) -> None:
    """A temporary child that inherits the subscriber's history and sees one event."""
    child_id = new_thread_id()
    fork = safe_seq([*snap.items, *turn.items]) or 0
    subscription = replace(spawn.call, state=CallState.SUBSCRIBED)
    turn.threads.append(
        NewThread(
            id=child_id,
            agent=agent.name,
            parent_id=snap.thread.id,
            parent_call_id=spawn.call.call_id,
            fork_seq=fork,
            root_id=snap.thread.root_id,
            metadata={"role": "event", "subscription": spawn.call.call_id},
            calls=[subscription],
        )
    )
    seed = EventMessage(call_id=spawn.call.call_id, content=spawn.content, associative=True)
    turn.enqueue.append(
        (child_id, f"{EVENT_SEED_PREFIX}{spawn.row.message_id}", seed, Priority.BACKGROUND)
    )


def report_to_parent(
    thread: ThreadInfo, content: str, call: ToolCall, *, final: bool, turn: Turn
) -> None:
    """Queue ``content`` for the parent, shown there as an event on the spawn call."""
    if thread.parent_id is None or thread.parent_call_id is None:
        return
    report = ChildReport(
        call_id=thread.parent_call_id, child_thread_id=thread.id, content=content, final=final
    )
    turn.enqueue.append((thread.parent_id, f"report:{call.call_id}", report, Priority.BACKGROUND))


def close_thread(
    thread: ThreadInfo, applied: Applied, turn: Turn, call: ToolCall, report: str | None
) -> None:
    """Close this thread: its subscriptions' streams stopped, its parent told. The slice
    answers what is still pending as it commits (``stores/closing.py``) and the store
    closes the descendants in the same transaction."""
    turn.closing = True
    for live in streams_to_stop(applied.calls.values(), thread):
        turn.outbox.append((live.call_id, "cancel"))
    if thread.metadata.get("role") == "event":
        if report:
            sub = thread.metadata.get("subscription", "")
            text = f"The thread that processed an event on subscription {sub} reports: {report}"
            report_to_parent(thread, text, call, final=False, turn=turn)
        return
    closing = f"{CLOSED_REPORT}{thread.id} closed." + (f" Final report: {report}" if report else "")
    report_to_parent(thread, closing, call, final=True, turn=turn)


def instructions_for(agent: Agent, thread: ThreadInfo) -> str:
    """The agent's instructions, plus what a temporary event thread must know."""
    if thread.metadata.get("role") != "event":
        return agent.instructions
    note = (
        f"You are temporary thread {thread.id}, processing one event on subscription "
        f"{thread.metadata.get('subscription')} for thread {thread.parent_id}. Your output is not "
        "seen by anyone: use report_to_parent if the parent should know, then close_thread."
    )
    return f"{agent.instructions}\n\n{note}".strip()
