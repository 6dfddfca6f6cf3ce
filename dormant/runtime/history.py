"""Pure history rules: apply a thread's pending inbox rows to its history.

No I/O here. ``apply_inbox`` takes what a slice loaded and returns what to write: new
items, changed call states and the fate of each inbox row (done, rejected, still deferred).

The rules (DESIGN section 5):

- The first result for a pending call answers it. A later result is an event if the call
  is an active subscription and a "late result" event if the call was interrupted. A
  second result for an answered call is rejected with a reason (``Client.deliver`` refuses
  it up front when it can tell; this catches the race of two results queued at once),
  except a passive call's timer firing after an event woke it, which carries no news. A
  repeated message id never gets here: the inbox's unique key refuses it.
- Events are threaded by default: each spawns a temporary child (``EventSpawn``) and the
  subscriber's history is unchanged. Associative events, child reports, parent messages
  and late results are shown inline as one ``EventShown`` row (a synthetic call and its
  result).
- While a non-passive call is pending, events and reports are deferred, in order, until
  every pending call is answered; a batch that does not settle the call flushes nothing.
- An event that arrives while only passive calls (sleep, wait_for_event) are pending wakes
  the thread: those calls are answered first.
- A message a tool scheduled (``ToolContext.schedule``, a timer whose message id starts
  with ``SCHEDULED``) is an event on its call when due. On a subscription it is like any
  event; on a plain or deferred call, already answered (or interrupted), it is shown inline,
  as an ``EventShown`` on that call, and never changes the call's state: the tool asked
  for it to reach the model, so it is not refused as a second result.
- User text interrupts every pending call, then is appended.
- Messages for unknown calls, cancelled subscriptions or a closed thread are rejected.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dormant.messages import (
    ApprovalDecision,
    ChildReport,
    EventMessage,
    EventShown,
    Item,
    ParentMessage,
    ToolResult,
    ToolResultMessage,
    UserMessage,
    UserText,
)
from dormant.stores.base import CallRecord, CallState, InboxRow, ThreadInfo, ThreadStatus

__all__ = [
    "INTERRUPTED",
    "LATE_RESULT",
    "SCHEDULED",
    "Applied",
    "Decide",
    "EventSpawn",
    "answered_reason",
    "apply_inbox",
    "has_pending",
    "new_call_id",
    "pending",
]

INTERRUPTED = "interrupted by the user"
WOKEN_BY_EVENT = "woken up: an event arrived"
LATE_RESULT = "late result: "
"""How a result for an interrupted call is shown: an event with this and its content."""
SCHEDULED = "schedule:"
"""The message id prefix of a timer a tool set with ``ToolContext.schedule``."""


def new_call_id() -> str:
    return f"evt_{uuid.uuid4().hex[:20]}"


def answered_reason(thread_id: str, call_id: str) -> str:
    """Why a second result for an answered call is refused (the sender sees this)."""
    return (
        f"call {call_id!r} of thread {thread_id!r} already has its result "
        "(only a subscription takes more than one)"
    )


def has_pending(calls: dict[str, CallRecord]) -> bool:
    """Whether any call still waits for its first result (``pending`` without the sort)."""
    return any(c.state is CallState.PENDING for c in calls.values())


def pending(calls: dict[str, CallRecord]) -> list[CallRecord]:
    """The calls still waiting for their first result, in call order."""
    return sorted((c for c in calls.values() if c.state is CallState.PENDING), key=lambda c: c.seq)


@dataclass(frozen=True)
class EventSpawn:
    """A threaded event: a temporary child of the subscriber will process it."""

    row: InboxRow
    call: CallRecord
    content: str


@dataclass
class Applied:
    """What applying the inbox decided; the slice turns it into a ``Commit``."""

    items: list[tuple[str, Item]] = field(default_factory=list)
    calls: dict[str, CallRecord] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)
    done: list[int] = field(default_factory=list)
    rejected: list[tuple[InboxRow, str]] = field(default_factory=list)
    deferred: list[InboxRow] = field(default_factory=list)
    spawns: list[EventSpawn] = field(default_factory=list)
    woke: bool = False
    """Something arrived that the model should see."""
    awaiting: set[str] = field(default_factory=set)
    """Pending calls held for a person's decision (``runtime/approvals.py``)."""

    @property
    def needs_completion(self) -> bool:
        return self.woke and not has_pending(self.calls)

    def set_state(self, call: CallRecord, state: CallState) -> None:
        self.calls[call.call_id] = replace(call, state=state)
        self.changed.add(call.call_id)


Decide = Callable[[InboxRow, ApprovalDecision, Applied], None]
"""Applies an approval decision (``ApprovalDesk.decide``): it needs the agent's tools."""


def apply_inbox(
    thread: ThreadInfo,
    calls: dict[str, CallRecord],
    inbox: list[InboxRow],
    new_id: Callable[[], str] = new_call_id,
    decide: Decide | None = None,
) -> Applied:
    """Apply ``inbox`` (pending rows, in inbox order) to a thread with ``calls``."""
    out = Applied(calls=dict(calls))
    if thread.status is ThreadStatus.CLOSED:
        out.rejected = [(row, f"thread {thread.id!r} is closed") for row in inbox]
        return out
    rules = _Rules(thread.id, out, new_id, decide)
    for row in inbox:
        rules.apply(row)
    # Deferred rows go after the batch that settled the pending calls, in their own order.
    while out.deferred and not _blocking(out.calls):
        waiting, out.deferred = out.deferred, []
        for row in waiting:
            rules.apply(row)
    return out


def _blocking(calls: dict[str, CallRecord]) -> bool:
    return any(not c.passive for c in pending(calls))


@dataclass
class _Rules:
    thread_id: str
    out: Applied
    new_id: Callable[[], str]
    decide: Decide | None = None

    def apply(self, row: InboxRow) -> None:
        match row.message:
            case UserMessage(text=text):
                self._interrupt_pending()
                self._append(row, UserText(text=text))
            case ToolResultMessage() as result:
                self._result(row, result)
            case EventMessage(call_id=call_id, content=content) if self._scheduled(row, call_id):
                self._event(row, call_id, content, final=False, scheduled=True)
            case EventMessage(call_id=call_id, content=content, final=final, associative=inline):
                self._event(row, call_id, content, final=final, threaded=not inline)
            case ChildReport(call_id=call_id, content=content, final=final):
                self._event(row, call_id, content, final=final)
            case ParentMessage(call_id=call_id, content=content):
                self._event(row, call_id, content, final=False)
            case ApprovalDecision() as decision if self.decide is not None:
                self.decide(row, decision, self.out)
            case ApprovalDecision():
                self._reject(row, "approval decisions are applied only by a slice")

    def _result(self, row: InboxRow, result: ToolResultMessage) -> None:
        call = self._call(row, result.call_id)
        if call is None:
            return
        match call.state:
            case CallState.PENDING:
                self.out.set_state(
                    call, CallState.SUBSCRIBED if call.subscription else CallState.ANSWERED
                )
                self._append(
                    row,
                    ToolResult(
                        call_id=call.call_id,
                        name=call.name,
                        content=result.content,
                        is_error=result.is_error,
                    ),
                )
            case CallState.INTERRUPTED if call.passive:
                # A sleep's timer racing its interruption carries no news: nothing to show.
                self._skip(row)
            case CallState.INTERRUPTED:
                # Never drop a real result: show it as a late event on that call.
                self._event(row, call.call_id, f"{LATE_RESULT}{result.content}", final=False)
            case CallState.SUBSCRIBED:
                self._event(row, call.call_id, result.content, final=False, threaded=True)
            case CallState.CANCELLED:
                self._reject(row, f"subscription {call.call_id!r} is no longer active")
            case CallState.ANSWERED if call.passive:
                self._skip(row)  # a sleep's timer after an event woke it: no news
            case CallState.ANSWERED:
                self._reject(row, answered_reason(self.thread_id, call.call_id))

    def _scheduled(self, row: InboxRow, call_id: str) -> bool:
        """A due ``ToolContext.schedule`` message on a call that is no subscription."""
        if not row.message_id.startswith(SCHEDULED):
            return False
        call = self.out.calls.get(call_id)
        return call is not None and not call.subscription

    def _event(
        self,
        row: InboxRow,
        call_id: str,
        content: str,
        *,
        final: bool,
        threaded: bool = False,
        scheduled: bool = False,
    ) -> None:
        call = self._call(row, call_id)
        if call is None:
            return
        if call.state is CallState.CANCELLED:
            self._reject(row, f"subscription {call_id!r} is no longer active")
            return
        if call.state is CallState.ANSWERED and not call.subscription and not scheduled:
            self._reject(row, f"call {call_id!r} is not a subscription and is already answered")
            return
        if threaded and call.state is not CallState.PENDING:
            # The subscriber's history is unchanged, so nothing it waits on is disturbed.
            if final:
                self.out.set_state(call, CallState.CANCELLED)
            self.out.spawns.append(EventSpawn(row, call, content))
            self.out.done.append(row.id)
            return
        if _blocking(self.out.calls):
            self.out.deferred.append(row)
            return
        self._wake_passive()
        if call.state is CallState.INTERRUPTED and not scheduled:
            # A late first result: from now on the call is answered (or a live subscription).
            self.out.set_state(
                call, CallState.SUBSCRIBED if call.subscription else CallState.ANSWERED
            )
        if final and call.subscription:
            self.out.set_state(self.out.calls[call_id], CallState.CANCELLED)
        shown = EventShown(
            call_id=self.new_id(),
            original_call_id=call.call_id,
            original_name=call.name,
            original_args=call.args,
            content=content,
        )
        self._append(row, shown)

    def _call(self, row: InboxRow, call_id: str) -> CallRecord | None:
        call = self.out.calls.get(call_id)
        if call is None:
            self._reject(row, f"thread {self.thread_id!r} never made call {call_id!r}")
        return call

    def _interrupt_pending(self) -> None:
        for call in pending(self.out.calls):
            self.out.set_state(call, CallState.INTERRUPTED)
            self.out.items.append(
                (
                    f"{call.call_id}:interrupted",
                    ToolResult(call_id=call.call_id, name=call.name, content=INTERRUPTED),
                )
            )

    def _wake_passive(self) -> None:
        for call in pending(self.out.calls):
            if call.passive:
                self.out.set_state(call, CallState.ANSWERED)
                self.out.items.append(
                    (
                        f"{call.call_id}:woken",
                        ToolResult(call_id=call.call_id, name=call.name, content=WOKEN_BY_EVENT),
                    )
                )

    def _append(self, row: InboxRow, item: Item) -> None:
        self.out.items.append((row.message_id, item))
        self.out.done.append(row.id)
        self.out.woke = True

    def _skip(self, row: InboxRow) -> None:
        """Done with ``row``: it changes nothing (a duplicate, a stale wake-up)."""
        self.out.done.append(row.id)

    def _reject(self, row: InboxRow, reason: str) -> None:
        self.out.rejected.append((row, reason))
