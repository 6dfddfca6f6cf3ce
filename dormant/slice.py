"""``run_slice``: one bounded unit of work for one thread (DESIGN section 4).

1. take the lease (or end: the holder drains the inbox); 2. load; 3-4. apply the pending
inbox rows (``history.apply_inbox``); 5. run at most one completion, buffered and retried,
looping only while every call of the turn was answered inside the slice (built-ins,
invalid calls), up to ``max_rounds_per_slice``; 6. validate each call; 7. commit once,
guarded by the thread's version; 8. dispatch the outbox, publish events; 9. release and
re-wake if rows arrived meanwhile.

A crash before 7 loses nothing (the rerun makes the one turn); a crash between 7 and 8
leaves undispatched outbox rows the sweeper re-dispatches.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from dormant.agents import Agent, AgentRegistry
from dormant.errors import CrashPoint, LeaseLost, ModelError, UnknownThread
from dormant.history import Applied, apply_inbox, pending
from dormant.messages import (
    EVENT_TOOL_NAME,
    AssistantTurn,
    Item,
    Chunk,
    Event,
    ItemAdded,
    Rejected,
    StatusChanged,
    ToolCall,
    ToolDispatched,
    ToolResult,
    ToolResultMessage,
    Usage,
)
from dormant.models.base import ModelRequest
from dormant.models.retry import complete_with_retry
from dormant.settings import Settings
from dormant.stores.base import (
    CallRecord,
    CallState,
    Commit,
    DedupSet,
    Lease,
    NewTimer,
    OutboxRow,
    Priority,
    SliceStore,
    Snapshot,
    StoredItem,
    ThreadStatus,
)
from dormant.tools.builtins import Answer, BuiltinContext, StartTimer, Wait, run_builtin

__all__ = [
    "Busy",
    "Closed",
    "Dispatcher",
    "EventSink",
    "Failed",
    "Idle",
    "Missing",
    "SliceDeps",
    "SliceOutcome",
    "Stale",
    "Stalled",
    "Waiting",
    "run_slice",
]


class Dispatcher(Protocol):
    def dispatch(self, row: OutboxRow) -> None:
        """Start the outbox row's work off the slice (a tool run, a cancel hook)."""
        ...

    def wake(self, thread_id: str, priority: int) -> None:
        """Arrange for a slice of ``thread_id`` to run."""
        ...


class EventSink(Protocol):
    def publish(self, event: Event) -> None: ...


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SliceDeps:
    """Everything a slice talks to, each behind a narrow protocol."""

    store: SliceStore
    lease: Lease
    dedup: DedupSet
    dispatcher: Dispatcher
    events: EventSink
    agents: AgentRegistry
    settings: Settings
    clock: Callable[[], datetime] = _utcnow
    sleep: Callable[[float], None] = time.sleep

    def crash(self, point: str) -> None:
        """Die here if the test-only setting arms ``point``."""
        if point in self.settings.crash_points:
            raise CrashPoint(point)


# Outcomes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Busy:
    """Another slice holds the lease; it drains the inbox."""

    thread_id: str


@dataclass(frozen=True)
class Missing:
    thread_id: str


@dataclass(frozen=True)
class Idle:
    thread_id: str


@dataclass(frozen=True)
class Waiting:
    thread_id: str
    call_ids: tuple[str, ...]


@dataclass(frozen=True)
class Closed:
    thread_id: str


@dataclass(frozen=True)
class Stale:
    """The version moved under us: another holder owns the thread; nothing was written."""

    thread_id: str


@dataclass(frozen=True)
class Failed:
    """The model failed; nothing was committed and the messages stay queued."""

    thread_id: str
    error: str
    stalled: bool


@dataclass(frozen=True)
class Stalled:
    """The thread is stalled and was not run; ``retry`` re-drives it."""

    thread_id: str
    error: str


SliceOutcome = Busy | Missing | Idle | Waiting | Closed | Stale | Failed | Stalled


def run_slice(thread_id: str, deps: SliceDeps) -> SliceOutcome:
    """Run one slice of ``thread_id``; see the module docstring for the steps."""
    token = deps.lease.acquire(thread_id, deps.settings.lease_ttl_s)
    if token is None:
        return Busy(thread_id)
    try:
        deps.crash("holding_lease")
        outcome, seen = _Slice(thread_id, token, deps).run()
    except CrashPoint:
        raise  # a simulated death keeps the lease until it expires, like a real one
    except BaseException:
        deps.lease.release(thread_id, token)
        raise
    deps.lease.release(thread_id, token)
    if seen is not None and deps.store.has_pending_after(thread_id, seen):
        deps.dispatcher.wake(thread_id, Priority.INTERACTIVE)
    return outcome


@dataclass
class _Turn:
    """What the slice will commit, built up step by step."""

    items: list[tuple[str, Item]] = field(default_factory=list)
    outbox: list[tuple[str, str]] = field(default_factory=list)
    timers: list[NewTimer] = field(default_factory=list)
    usage: Usage | None = None


class _Slice:
    def __init__(self, thread_id: str, token: str, deps: SliceDeps) -> None:
        self.thread_id = thread_id
        self.token = token
        self.deps = deps
        self.renewed_at = time.monotonic()

    def run(self) -> tuple[SliceOutcome, int | None]:
        deps = self.deps
        try:
            snap = deps.store.load(self.thread_id)
        except UnknownThread:
            return Missing(self.thread_id), None
        if snap.thread.status is ThreadStatus.STALLED:
            return Stalled(self.thread_id, snap.thread.last_error), None
        if not snap.inbox:
            return _settled(self.thread_id, snap.thread.status, snap.calls), None
        agent = deps.agents.get_agent(snap.thread.agent)
        applied = apply_inbox(snap.thread, snap.calls, snap.inbox)
        turn = _Turn(items=list(applied.items))
        if applied.needs_completion:
            try:
                self._converse(agent, snap, applied, turn)
            except ModelError as error:
                info = deps.store.record_failure(
                    self.thread_id, f"{type(error).__name__}: {error}", deps.settings.stall_after_failures
                )
                stalled = info.status is ThreadStatus.STALLED
                if stalled:
                    deps.events.publish(
                        StatusChanged(thread_id=self.thread_id, status=info.status, detail=info.last_error)
                    )
                return Failed(self.thread_id, info.last_error, stalled), None
        return self._commit(snap, applied, turn)

    # step 5-6 -------------------------------------------------------------------------

    def _converse(self, agent: Agent, snap: Snapshot, applied: Applied, turn: _Turn) -> None:
        deps = self.deps
        model = agent.resolved_model()
        history = [s.item for s in snap.items] + [item for _, item in applied.items]
        specs = agent.specs()
        for _ in range(deps.settings.max_rounds_per_slice):
            request = ModelRequest(
                self.thread_id, agent.instructions, tuple(history), specs, agent.model_settings
            )
            completion = complete_with_retry(
                model,
                request,
                self._on_chunk,
                attempts=deps.settings.model_attempts,
                base_s=deps.settings.model_backoff_s,
                max_s=deps.settings.model_backoff_max_s,
                sleep=deps.sleep,
            )
            deps.crash("after_model")
            calls = _fresh_ids(completion.calls, applied.calls)
            assistant = AssistantTurn(text=completion.text, calls=calls)
            turn.items.append((f"turn:{uuid.uuid4().hex}", assistant))
            history.append(assistant)
            turn.usage = completion.usage
            seq = snap.next_seq + len(turn.items) - 1
            for call in calls:
                result = self._start_call(agent, call, seq, applied, turn)
                if result is not None:
                    turn.items.append((f"{call.call_id}:result", result))
                    history.append(result)
            if not calls or pending(applied.calls):
                return

    def _start_call(
        self, agent: Agent, call: ToolCall, seq: int, applied: Applied, turn: _Turn
    ) -> ToolResult | None:
        """Record ``call``; its result if the slice answers it now, else None (pending)."""

        def record(state: CallState, *, subscription: bool = False, passive: bool = False) -> None:
            applied.calls[call.call_id] = CallRecord(
                call.call_id, call.name, call.args, seq, state, subscription, passive
            )
            applied.changed.add(call.call_id)

        def answer(content: str, is_error: bool = False) -> ToolResult:
            record(CallState.ANSWERED)
            return ToolResult(call_id=call.call_id, name=call.name, content=content, is_error=is_error)

        tool = agent.tool(call.name)
        if call.name == EVENT_TOOL_NAME:
            return answer(
                f"Error: you cannot call {EVENT_TOOL_NAME}; events are delivered to you "
                "automatically as its results.",
                is_error=True,
            )
        if tool is None:
            available = ", ".join(s.name for s in agent.specs())
            return answer(
                f"Error: tool {call.name!r} does not exist. Available tools: {available}.",
                is_error=True,
            )
        error = tool.error_for(call.args)
        if error is not None:
            return answer(error, is_error=True)
        if not tool.builtin:
            record(CallState.PENDING, subscription=tool.subscription)
            turn.outbox.append((call.call_id, "tool"))
            return None
        ctx = BuiltinContext(self.thread_id, applied.calls, self.deps.clock())
        match run_builtin(call.name, tool.validate(call.args), ctx):
            case Answer(content=content, is_error=is_error, cancel_call_id=cancel):
                if cancel is not None:
                    applied.set_state(applied.calls[cancel], CallState.CANCELLED)
                    turn.outbox.append((cancel, "cancel"))
                return answer(content, is_error)
            case StartTimer(due_at=due_at, content=content):
                record(CallState.PENDING, passive=True)
                message = ToolResultMessage(call_id=call.call_id, content=content)
                turn.timers.append(NewTimer(call.call_id, due_at, f"timer:{call.call_id}", message))
            case Wait():
                record(CallState.PENDING, passive=True)
        return None

    def _on_chunk(self, text: str) -> None:
        self.deps.events.publish(Chunk(thread_id=self.thread_id, text=text))
        ttl_s = self.deps.settings.lease_ttl_s
        if time.monotonic() - self.renewed_at > ttl_s / 3:
            if not self.deps.lease.renew(self.thread_id, self.token, ttl_s):
                raise LeaseLost(self.thread_id)
            self.renewed_at = time.monotonic()

    # steps 7-8 ------------------------------------------------------------------------

    def _commit(self, snap: Snapshot, applied: Applied, turn: _Turn) -> tuple[SliceOutcome, int | None]:
        deps = self.deps
        thread = snap.thread
        status = thread.status if thread.status is ThreadStatus.CLOSED else (
            ThreadStatus.WAITING if pending(applied.calls) else ThreadStatus.IDLE
        )
        stopped = [
            cid
            for cid in applied.changed
            if cid in snap.calls
            and snap.calls[cid].passive
            and snap.calls[cid].state is CallState.PENDING
            and applied.calls[cid].state is not CallState.PENDING
        ]
        items = [
            StoredItem(snap.next_seq + i, message_id, item)
            for i, (message_id, item) in enumerate(turn.items)
        ]
        seen = max(row.id for row in snap.inbox)
        commit = Commit(
            thread_id=self.thread_id,
            version=thread.version,
            status=status,
            inbox_seen=seen,
            items=items,
            calls=[applied.calls[cid] for cid in sorted(applied.changed)],
            done=applied.done,
            rejected=[(row.id, reason) for row, reason in applied.rejected],
            outbox=turn.outbox,
            timers=turn.timers,
            cancel_timers=stopped,
            usage=turn.usage,
        )
        deps.crash("before_commit")
        rows = deps.store.commit(commit)
        if rows is None:
            return Stale(self.thread_id), None
        deps.crash("after_commit")
        done = set(applied.done)
        deps.dedup.add(self.thread_id, [r.message_id for r in snap.inbox if r.id in done])
        for stored in items:
            deps.events.publish(ItemAdded(thread_id=self.thread_id, seq=stored.seq, item=stored.item))
        for row, reason in applied.rejected:
            deps.events.publish(Rejected(thread_id=self.thread_id, message_id=row.message_id, reason=reason))
        if status is not thread.status:
            deps.events.publish(StatusChanged(thread_id=self.thread_id, status=status))
        for row in rows:
            deps.dispatcher.dispatch(row)
            deps.store.mark_dispatched([row.id])
            call = applied.calls[row.call_id]
            deps.events.publish(ToolDispatched(thread_id=self.thread_id, call_id=call.call_id, name=call.name))
        return _settled(self.thread_id, status, applied.calls), seen


def _settled(thread_id: str, status: ThreadStatus, calls: dict[str, CallRecord]) -> SliceOutcome:
    if status is ThreadStatus.CLOSED:
        return Closed(thread_id)
    waiting = tuple(c.call_id for c in pending(calls))
    return Waiting(thread_id, waiting) if waiting else Idle(thread_id)


def _fresh_ids(calls: tuple[ToolCall, ...], known: dict[str, CallRecord]) -> tuple[ToolCall, ...]:
    """The calls with an empty or reused id given a fresh one, so each id has one result."""
    seen = set(known)
    fresh = []
    for call in calls:
        if not call.call_id or call.call_id in seen:
            call = call.model_copy(update={"call_id": f"call_{uuid.uuid4().hex[:24]}"})
        seen.add(call.call_id)
        fresh.append(call)
    return tuple(fresh)
