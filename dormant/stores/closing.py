"""What closing a thread writes, whichever way it closes (``close_thread``, or an ancestor
closing its subtree): every call still pending gets its result in the same commit.

A closed thread never runs again, yet its history must stay well formed for any provider
(and for the invariant checker: every call has exactly one result). Without this, a child
closed by its parent before its first message was applied kept its spawn call without a
result forever, the message itself refused as sent to a closed thread. A tool whose call is
answered here does not run (the runner runs only pending calls); a live subscription is
cancelled, and its "cancel" outbox row, written by the caller, stops the tool's stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from dormant.messages import ToolResult
from dormant.stores.base import CallRecord, CallState, StoredItem, ThreadInfo

__all__ = ["close_calls", "streams_to_stop"]


def close_calls(
    thread_id: str, calls: Iterable[CallRecord], next_seq: int
) -> tuple[list[CallRecord], list[StoredItem]]:
    """The calls that closing ``thread_id`` changes and the results it appends (seqs from
    ``next_seq`` on): pending calls answered, live subscriptions cancelled."""
    changed: list[CallRecord] = []
    results: list[StoredItem] = []
    for call in sorted(calls, key=lambda c: (c.seq, c.call_id)):
        if call.state is CallState.PENDING:
            result = ToolResult(
                call_id=call.call_id,
                name=call.name,
                content=f"Not answered: thread {thread_id} was closed first.",
                is_error=True,
            )
            results.append(StoredItem(next_seq + len(results), f"{call.call_id}:closed", result))
        elif not (call.subscription and call.state is CallState.SUBSCRIBED):
            continue
        changed.append(
            replace(call, state=CallState.CANCELLED if call.subscription else CallState.ANSWERED)
        )
    return changed, results


def streams_to_stop(calls: Iterable[CallRecord], thread: ThreadInfo) -> list[CallRecord]:
    """The live subscriptions a closing ``thread`` cancels with a "cancel" outbox row: its
    own (first result due, or events flowing), not the spawn or subscription call it
    inherited from its parent, which is the parent's to stop, and not its children's spawn
    calls, which the store closes with their threads.

    An event thread's copy of its subscription is the parent's call: its position says
    nothing (an event thread forks at its subscriber's last safe point, which is before the
    subscription while another call of that turn is pending), so its id decides. Stopping
    it ran the subscriber's cancel hook on every event, the subscription still live."""
    live = (CallState.PENDING, CallState.SUBSCRIBED)
    return [
        c
        for c in calls
        if c.subscription
        and c.state in live
        and c.seq > (thread.fork_seq or 0)
        and c.call_id != thread.parent_call_id
        and c.name != "spawn_thread"
    ]
