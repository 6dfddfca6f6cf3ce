"""The invariant checker: what must hold of every thread in a store, found row by row.

The runtime's promises, stated over stored rows so that they can be checked after any run
(a chaos test, a restore from backup, a production database) without trusting the code
that wrote them:

- every tool call in a thread's transcript has exactly one result, unless it is pending,
  and a call record (the index that routes its results and events);
- no message id is stored twice in a thread, and events are shown once each;
- every message marked consumed reached a history: user text in arrival order, results and
  events in the thread's own (a threaded event in the temporary child it started; a timer
  that woke a wait already over shows nothing, by design);
- seqs are contiguous along each lineage (a child's first own seq is ``fork_seq + 1``);
- a closed thread has nothing live: no call pending, no subscription still streaming;
- nothing is stuck: a thread's status agrees with its calls, a stalled thread says why, no
  inbox row waits with no slice on its way, no deferred row outlives the calls it waits on,
  and every outbox row was run.

What no stored row can show is not checked: a tool run that dies (its worker killed) every
time it is re-sent looks like one still running.

Work still in flight is not a problem while it is younger than ``grace_s``: check a live
system with a grace above the sweep interval, a quiesced one with none.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dormant.messages import (
    ApprovalDecision,
    AssistantTurn,
    EventShown,
    ToolResult,
    ToolResultMessage,
    UserMessage,
    UserText,
)
from dormant.runtime.children import EVENT_SEED_PREFIX
from dormant.stores.base import (
    RETRIED_MARK,
    CallRecord,
    CallState,
    InboxRow,
    InboxState,
    Store,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
)
from dormant.stores.lineage import full_history

__all__ = ["Problem", "check_store"]

_ALL = 10**9
"""``threads(limit=...)`` for every thread: the checker reads the whole store."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken promise: where it broke and what was found."""

    thread_id: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.thread_id}  {self.rule}: {self.detail}"


def check_store(
    store: Store, *, now: datetime | None = None, grace_s: float = 0.0
) -> list[Problem]:
    """Every problem found in ``store``, thread by thread (oldest first); empty when sound."""
    settled_before = (now or datetime.now(UTC)) - timedelta(seconds=grace_s)
    problems: list[Problem] = []
    threads = list(reversed(store.threads(limit=_ALL)))
    children: dict[str, list[str]] = defaultdict(list)
    for thread in threads:
        if thread.parent_id is not None:
            children[thread.parent_id].append(thread.id)
    for thread in threads:
        problems.extend(_thread_problems(store, thread, settled_before, children[thread.id]))
    for row in store.undispatched(settled_before, limit=_ALL, lost_before=settled_before):
        state = "was dispatched but never ran" if row.dispatched_at else "was never dispatched"
        problems.append(
            Problem(row.thread_id, "outbox", f"row {row.id} ({row.action} {row.call_id}) {state}")
        )
    return problems


def _thread_problems(
    store: Store, thread: ThreadInfo, settled_before: datetime, children: list[str]
) -> Iterator[Problem]:
    def problem(rule: str, detail: str) -> Problem:
        return Problem(thread.id, rule, detail)

    own = store.own_items(thread.id)
    first = (thread.fork_seq or 0) + 1
    seqs = [s.seq for s in own]
    if seqs and seqs != list(range(first, first + len(seqs))):
        yield problem("seqs", f"own seqs {_brief(seqs)} do not run on from {first}")
    repeated = [m for m, n in Counter(s.message_id for s in own).items() if n > 1]
    if repeated:
        yield problem("message ids", f"stored more than once: {_brief(repeated)}")

    calls = store.load(thread.id).calls
    seen = full_history(store, thread)
    results = Counter(s.item.call_id for s in seen if isinstance(s.item, ToolResult))
    made = [c for s in seen if isinstance(s.item, AssistantTurn) for c in s.item.calls]
    for call in made:
        record = calls.get(call.call_id)
        expected = 0 if record is not None and record.state is CallState.PENDING else 1
        if results[call.call_id] != expected:
            yield problem(
                "one result per call",
                f"{call.name} {call.call_id} has {results[call.call_id]} results",
            )
    unindexed = [
        c
        for s in own
        if isinstance(s.item, AssistantTurn)
        for c in s.item.calls
        if c.call_id not in calls
    ]
    if unindexed:
        yield problem(
            "call records", f"calls without a record: {_brief(c.call_id for c in unindexed)}"
        )
    strays = set(results) - {c.call_id for c in made}
    if strays:
        yield problem("one result per call", f"results for calls never made: {_brief(strays)}")
    shown = Counter(s.item.call_id for s in own if isinstance(s.item, EventShown))
    if any(n > 1 for n in shown.values()):
        yield problem("events", "an event is shown more than once")

    inbox = store.inbox(thread.id)
    arrived = [
        r.message_id
        for r in sorted(inbox, key=lambda r: r.id)
        if r.state is InboxState.DONE
        and isinstance(r.message, UserMessage)
        and not r.reason.startswith(RETRIED_MARK)  # applied when an operator retried it
    ]
    applied = [s.message_id for s in own if isinstance(s.item, UserText)]
    if [m for m in applied if m in set(arrived)] != [m for m in arrived if m in set(applied)]:
        yield problem("user order", "user messages are not in the order they arrived")
    missing = set(arrived) - set(applied)
    if missing:
        yield problem("user messages", f"consumed but not in the history: {_brief(missing)}")
    unshown = _consumed_unshown(store, own, calls, inbox, children)
    if unshown:
        yield problem("messages", f"consumed but not in any history: {_brief(unshown)}")

    if thread.status is ThreadStatus.CLOSED:
        live = [c.call_id for c in calls.values() if _live(c)]
        if live:
            yield problem("closed", f"closed with calls still live: {_brief(live)}")
    yield from _stuck(thread, calls, inbox, settled_before, problem)


def _consumed_unshown(
    store: Store,
    own: list[StoredItem],
    calls: dict[str, CallRecord],
    inbox: list[InboxRow],
    children: list[str],
) -> list[str]:
    """Message ids of results, events, reports and parent messages marked done that no
    history shows (user text has its own, ordered, check)."""
    shown = {s.message_id for s in own}
    forwarded: set[str] | None = None
    unshown: list[str] = []
    for row in inbox:
        if row.state is not InboxState.DONE or isinstance(row.message, UserMessage):
            continue
        if row.message_id in shown or _stale_wake(row, calls):
            continue
        if forwarded is None:  # read the children only when a row was not shown here
            forwarded = _child_message_ids(store, children)
        if f"{EVENT_SEED_PREFIX}{row.message_id}" not in forwarded:
            unshown.append(row.message_id)
    return unshown


def _stale_wake(row: InboxRow, calls: dict[str, CallRecord]) -> bool:
    """A wait's timer that arrived after the wait was over (an event or user text ended
    it): done, with no news to show (``runtime/history.py``); likewise an approval's
    timeout that fired after the call was settled otherwise (``runtime/approvals.py``)."""
    if isinstance(row.message, ApprovalDecision):
        return row.message.timed_out
    if not isinstance(row.message, ToolResultMessage):
        return False
    call = calls.get(row.message.call_id)
    return call is not None and call.passive and call.state is not CallState.PENDING


def _child_message_ids(store: Store, children: list[str]) -> set[str]:
    """Every message id the children hold, in their inbox or their own history."""
    ids: set[str] = set()
    for child in children:
        ids.update(row.message_id for row in store.inbox(child))
        ids.update(s.message_id for s in store.own_items(child))
    return ids


def _live(call: CallRecord) -> bool:
    """A call closing must have settled (``stores/closing.py``): pending, or a
    subscription still streaming."""
    return call.state is CallState.PENDING or (
        call.subscription and call.state is CallState.SUBSCRIBED
    )


def _stuck(
    thread: ThreadInfo,
    calls: dict[str, CallRecord],
    inbox: list[InboxRow],
    settled_before: datetime,
    problem: Callable[[str, str], Problem],
) -> Iterator[Problem]:
    pending_calls = [c for c in calls.values() if c.state is CallState.PENDING]
    if thread.status is ThreadStatus.STALLED and not thread.last_error:
        yield problem("stuck", "stalled without a reason")
    if thread.status is ThreadStatus.WAITING and not pending_calls:
        yield problem("stuck", "waiting, but no call is pending")
    if thread.status is ThreadStatus.IDLE and pending_calls:
        yield problem(
            "stuck", f"idle with pending calls: {_brief(c.call_id for c in pending_calls)}"
        )
    if thread.status is ThreadStatus.STALLED:
        return  # its rows wait for an operator's retry, which is the point of stalling
    backing_off = thread.retry_at is not None and thread.retry_at > settled_before
    for row in inbox:
        old = row.created_at < settled_before
        if row.state is InboxState.PENDING and old and not backing_off:
            yield problem("stuck", f"inbox row {row.id} ({row.message_id}) was never applied")
        if row.state is InboxState.DEFERRED and old and not pending_calls:
            yield problem(
                "stuck", f"inbox row {row.id} ({row.message_id}) deferred with no call pending"
            )


def _brief(values: Iterable[object], most: int = 5) -> str:
    items = [str(v) for v in values]
    more = f" (+{len(items) - most} more)" if len(items) > most else ""
    return ", ".join(items[:most]) + more
