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
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol

from dormant.agents import Agent, AgentRegistry
from dormant.errors import (
    CrashPoint,
    LeaseLost,
    ModelError,
    SteeredAway,
    UnknownAgent,
    UnknownThread,
)
from dormant.history import Applied, EventSpawn, apply_inbox, pending
from dormant.messages import (
    EVENT_TOOL_NAME,
    AssistantTurn,
    ChildReport,
    Chunk,
    Event,
    EventMessage,
    Inbound,
    Item,
    ItemAdded,
    ParentMessage,
    Rejected,
    StatusChanged,
    Summary,
    ToolCall,
    ToolDispatched,
    ToolResult,
    ToolResultMessage,
    Usage,
)
from dormant.models.base import Completion, Model, ModelRequest
from dormant.models.retry import complete_with_retry
from dormant.settings import Settings
from dormant.stores.base import (
    CallRecord,
    CallState,
    Commit,
    DedupSet,
    Lease,
    NewThread,
    NewTimer,
    OutboxRow,
    Priority,
    SliceStore,
    Snapshot,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
)
from dormant.stores.lineage import compacted
from dormant.tools.builtins import (
    Answer,
    BuiltinContext,
    Close,
    MessageChild,
    Report,
    Spawn,
    StartTimer,
    Wait,
    run_builtin,
)

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
    "Steered",
    "Waiting",
    "run_slice",
    "safe_seq",
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
    """The model failed; nothing was committed and the messages stay queued until
    ``retry_at`` (the sweeper will not wake the thread before)."""

    thread_id: str
    error: str
    stalled: bool
    retry_at: datetime | None = None


@dataclass(frozen=True)
class Steered:
    """New user text cancelled the completion (``interrupt`` steering); nothing was
    committed and a new slice applies everything, the new text included."""

    thread_id: str


@dataclass(frozen=True)
class Stalled:
    """The thread is stalled and was not run; ``retry`` re-drives it."""

    thread_id: str
    error: str


SliceOutcome = Busy | Missing | Idle | Waiting | Closed | Stale | Failed | Stalled | Steered


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

    next_seq: int
    items: list[StoredItem] = field(default_factory=list)
    outbox: list[tuple[str, str]] = field(default_factory=list)
    timers: list[NewTimer] = field(default_factory=list)
    threads: list[NewThread] = field(default_factory=list)
    enqueue: list[tuple[str, str, Inbound, int]] = field(default_factory=list)
    usage: Usage | None = None
    closing: bool = False

    def add(self, message_id: str, item: Item) -> StoredItem:
        stored = StoredItem(self.next_seq + len(self.items), message_id, item)
        self.items.append(stored)
        return stored


class _Slice:
    def __init__(self, thread_id: str, token: str, deps: SliceDeps) -> None:
        self.thread_id = thread_id
        self.token = token
        self.deps = deps
        self.renewed_at = time.monotonic()
        self.steer_checked_at = time.monotonic()
        self.seen = 0
        self.steering = False

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
        self.seen = max(row.id for row in snap.inbox)
        try:
            agent = deps.agents.get_agent(snap.thread.agent)
        except UnknownAgent as error:
            # A deployment without this agent can never run the thread: stall it visibly
            # (``retry`` once the agent is deployed) rather than fail on every sweep.
            return self._failed(snap, f"{error} in this worker", stall_after=1), None
        self.steering = agent.steering == "interrupt"
        applied = apply_inbox(snap.thread, snap.calls, snap.inbox)
        turn = _Turn(snap.next_seq)
        for message_id, item in applied.items:
            turn.add(message_id, item)
        for spawn in applied.spawns:
            self._spawn_event_child(agent, snap, turn, spawn)
        if applied.needs_completion:
            try:
                self._converse(agent, snap, applied, turn)
            except SteeredAway:
                return Steered(self.thread_id), self.seen
            except ModelError as error:
                return self._failed(snap, f"{type(error).__name__}: {error}"), None
        return self._commit(snap, applied, turn)

    def _failed(self, snap: Snapshot, error: str, stall_after: int | None = None) -> Failed:
        """Record a failed slice: nothing was consumed; the next try waits (backoff)."""
        deps = self.deps
        settings = deps.settings
        wait_s = min(
            settings.failure_backoff_max_s,
            settings.failure_backoff_s * 2**snap.thread.failures,
        )
        retry_at = deps.clock() + timedelta(seconds=wait_s)
        info = deps.store.record_failure(
            self.thread_id, error, stall_after or settings.stall_after_failures, retry_at
        )
        stalled = info.status is ThreadStatus.STALLED
        if stalled:
            deps.events.publish(
                StatusChanged(thread_id=self.thread_id, status=info.status, detail=info.last_error)
            )
        return Failed(self.thread_id, info.last_error, stalled, retry_at)

    # step 5-6 -------------------------------------------------------------------------

    def _converse(self, agent: Agent, snap: Snapshot, applied: Applied, turn: _Turn) -> None:
        deps = self.deps
        model = agent.resolved_model()
        visible = [*snap.items, *turn.items]
        if _needs_compaction(agent, model, snap.thread):
            visible = self._compact(agent, model, snap.items, visible, turn)
        instructions = _instructions(agent, snap.thread)
        specs = agent.specs()
        for _ in range(deps.settings.max_rounds_per_slice):
            request = ModelRequest(
                self.thread_id,
                instructions,
                tuple(s.item for s in visible),
                specs,
                agent.model_settings,
            )
            completion = self._complete(model, request)
            deps.crash("after_model")
            calls = _fresh_ids(completion.calls, applied.calls)
            assistant = turn.add(
                f"turn:{uuid.uuid4().hex}", AssistantTurn(text=completion.text, calls=calls)
            )
            visible.append(assistant)
            turn.usage = completion.usage
            ctx = BuiltinContext(
                snap.thread,
                applied.calls,
                lambda: deps.store.children(self.thread_id),
                deps.clock(),
            )
            for call in calls:
                result = self._start_call(agent, call, assistant.seq, applied, turn, ctx)
                if result is not None:
                    visible.append(turn.add(f"{call.call_id}:result", result))
            if not calls or turn.closing or pending(applied.calls):
                return

    def _complete(self, model: Model, request: ModelRequest) -> Completion:
        settings = self.deps.settings
        return complete_with_retry(
            model,
            request,
            self._on_chunk,
            attempts=settings.model_attempts,
            base_s=settings.model_backoff_s,
            max_s=settings.model_backoff_max_s,
            sleep=self.deps.sleep,
        )

    def _compact(
        self,
        agent: Agent,
        model: Model,
        committed: list[StoredItem],
        visible: list[StoredItem],
        turn: _Turn,
    ) -> list[StoredItem]:
        """Summarise the committed history up to its last safe point; what the model sees
        next is the summary, then everything after it (this slice's new input included)."""
        upto = safe_seq(committed)
        covered = [s for s in committed if upto is not None and s.seq <= upto]
        if upto is None or len(covered) < 2:
            return visible
        items = tuple(s.item for s in covered)
        request = ModelRequest(
            self.thread_id, COMPACTION_INSTRUCTIONS, items, (), agent.model_settings
        )
        summary = Summary(text=self._complete(model, request).text, upto_seq=upto)
        stored = turn.add(f"summary:{uuid.uuid4().hex}", summary)
        turn.usage = Usage()  # the old count no longer describes the history (a536c9f)
        return compacted([*visible, stored])

    def _start_call(
        self,
        agent: Agent,
        call: ToolCall,
        seq: int,
        applied: Applied,
        turn: _Turn,
        ctx: BuiltinContext,
    ) -> ToolResult | None:
        """Record ``call``; its result if the slice answers it now, else None (pending)."""

        def record(state: CallState, *, subscription: bool = False, passive: bool = False) -> None:
            applied.calls[call.call_id] = CallRecord(
                call.call_id, call.name, call.args, seq, state, subscription, passive
            )
            applied.changed.add(call.call_id)

        def answer(
            content: str, is_error: bool = False, state: CallState = CallState.ANSWERED
        ) -> ToolResult:
            record(state, subscription=state is CallState.SUBSCRIBED)
            return ToolResult(
                call_id=call.call_id, name=call.name, content=content, is_error=is_error
            )

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
        thread = ctx.thread
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
            case Spawn(instructions=instructions):
                child = self._spawn_child(agent, thread, call, seq, instructions, turn)
                return answer(
                    f"Child thread {child} started. "
                    "Its reports will reach you as events on this call.",
                    state=CallState.SUBSCRIBED,
                )
            case Report(content=content):
                self._report(
                    thread,
                    f"Report from child thread {thread.id}: {content}",
                    call,
                    final=False,
                    turn=turn,
                )
                return answer("Report sent to the parent thread.")
            case Close(report=report):
                self._close(thread, applied, turn, call, report)
                return answer("Thread closed.")
            case MessageChild(child=child, content=content):
                note = ParentMessage(
                    call_id=child.parent_call_id or "",
                    content=f"Message from the parent thread: {content}",
                )
                turn.enqueue.append((child.id, f"parent:{call.call_id}", note, Priority.BACKGROUND))
                return answer(f"Message sent to child thread {child.id}.")
        return None

    # threads ----------------------------------------------------------------------------

    def _spawn_child(
        self,
        agent: Agent,
        thread: ThreadInfo,
        call: ToolCall,
        seq: int,
        instructions: str,
        turn: _Turn,
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
        turn.enqueue.append((child_id, f"seed:{call.call_id}", seed, Priority.BACKGROUND))
        return child_id

    def _spawn_event_child(
        self, agent: Agent, snap: Snapshot, turn: _Turn, spawn: EventSpawn
    ) -> None:
        """A temporary child that inherits the subscriber's history and sees one event."""
        child_id = new_thread_id()
        fork = safe_seq([*snap.items, *turn.items]) or 0
        subscription = replace(spawn.call, state=CallState.SUBSCRIBED)
        turn.threads.append(
            NewThread(
                id=child_id,
                agent=agent.name,
                parent_id=self.thread_id,
                parent_call_id=spawn.call.call_id,
                fork_seq=fork,
                root_id=snap.thread.root_id,
                metadata={"role": "event", "subscription": spawn.call.call_id},
                calls=[subscription],
            )
        )
        seed = EventMessage(call_id=spawn.call.call_id, content=spawn.content, associative=True)
        turn.enqueue.append((child_id, f"event:{spawn.row.message_id}", seed, Priority.BACKGROUND))

    def _report(
        self, thread: ThreadInfo, content: str, call: ToolCall, *, final: bool, turn: _Turn
    ) -> None:
        if thread.parent_id is None or thread.parent_call_id is None:
            return
        report = ChildReport(
            call_id=thread.parent_call_id, child_thread_id=thread.id, content=content, final=final
        )
        turn.enqueue.append(
            (thread.parent_id, f"report:{call.call_id}", report, Priority.BACKGROUND)
        )

    def _close(
        self, thread: ThreadInfo, applied: Applied, turn: _Turn, call: ToolCall, report: str | None
    ) -> None:
        """Close this thread: descendants closed, own subscriptions cancelled, parent told."""
        turn.closing = True
        forked_at = thread.fork_seq or 0
        for live in [c for c in applied.calls.values() if c.subscription and c.state in _LIVE]:
            if live.seq <= forked_at:
                continue  # inherited from the parent (its spawn or subscription call): not ours
            if live.name != "spawn_thread":
                turn.outbox.append((live.call_id, "cancel"))
            applied.set_state(live, CallState.CANCELLED)
        if thread.metadata.get("role") == "event":
            if report:
                sub = thread.metadata.get("subscription", "")
                text = f"The thread that processed an event on subscription {sub} reports: {report}"
                self._report(thread, text, call, final=False, turn=turn)
            return
        closing = f"Child thread {thread.id} closed." + (
            f" Final report: {report}" if report else ""
        )
        self._report(thread, closing, call, final=True, turn=turn)

    def _on_chunk(self, text: str) -> None:
        deps = self.deps
        deps.events.publish(Chunk(thread_id=self.thread_id, text=text))
        now = time.monotonic()
        ttl_s = deps.settings.lease_ttl_s
        if now - self.renewed_at > ttl_s / 3:
            if not deps.lease.renew(self.thread_id, self.token, ttl_s):
                raise LeaseLost(self.thread_id)
            self.renewed_at = now
        if self.steering and now - self.steer_checked_at >= deps.settings.steer_check_s:
            self.steer_checked_at = now
            if deps.store.has_pending_after(self.thread_id, self.seen, user_text_only=True):
                raise SteeredAway(self.thread_id)

    # steps 7-8 ------------------------------------------------------------------------

    def _commit(
        self, snap: Snapshot, applied: Applied, turn: _Turn
    ) -> tuple[SliceOutcome, int | None]:
        deps = self.deps
        thread = snap.thread
        status = _status(thread, applied, turn)
        stopped = [
            cid
            for cid in applied.changed
            if cid in snap.calls
            and snap.calls[cid].passive
            and snap.calls[cid].state is CallState.PENDING
            and applied.calls[cid].state is not CallState.PENDING
        ]
        commit = Commit(
            thread_id=self.thread_id,
            version=thread.version,
            status=status,
            inbox_seen=self.seen,
            items=turn.items,
            calls=[applied.calls[cid] for cid in sorted(applied.changed)],
            done=applied.done,
            rejected=[(row.id, reason) for row, reason in applied.rejected],
            deferred=[row.id for row in applied.deferred],
            outbox=turn.outbox,
            timers=turn.timers,
            cancel_timers=stopped,
            threads=turn.threads,
            close_descendants=status is ThreadStatus.CLOSED
            and thread.status is not ThreadStatus.CLOSED,
            enqueue=turn.enqueue,
            usage=turn.usage,
        )
        deps.crash("before_commit")
        rows = deps.store.commit(commit)
        if rows is None:
            return Stale(self.thread_id), None
        deps.crash("after_commit")
        self._after_commit(snap, applied, turn, status, rows)
        return _settled(self.thread_id, status, applied.calls), self.seen

    def _after_commit(
        self,
        snap: Snapshot,
        applied: Applied,
        turn: _Turn,
        status: ThreadStatus,
        rows: list[OutboxRow],
    ) -> None:
        deps = self.deps
        done = set(applied.done)
        deps.dedup.add(self.thread_id, [r.message_id for r in snap.inbox if r.id in done])
        for stored in turn.items:
            deps.events.publish(
                ItemAdded(thread_id=self.thread_id, seq=stored.seq, item=stored.item)
            )
        for row, reason in applied.rejected:
            deps.events.publish(
                Rejected(thread_id=self.thread_id, message_id=row.message_id, reason=reason)
            )
        if status is not snap.thread.status:
            deps.events.publish(StatusChanged(thread_id=self.thread_id, status=status))
        for thread_id in {t for t, *_ in turn.enqueue}:
            deps.dispatcher.wake(thread_id, Priority.BACKGROUND)
        for outbox in rows:
            deps.dispatcher.dispatch(outbox)
            deps.store.mark_dispatched([outbox.id])
            known = applied.calls.get(outbox.call_id)
            name = known.name if known and outbox.thread_id == self.thread_id else outbox.action
            deps.events.publish(
                ToolDispatched(thread_id=outbox.thread_id, call_id=outbox.call_id, name=name)
            )


_LIVE = (CallState.PENDING, CallState.SUBSCRIBED)

COMPACTION_INSTRUCTIONS = (
    "Summarise the conversation so far for your own future reference: the user's goals, "
    "decisions made, facts learned from tools and events, open questions and what you were "
    "about to do. Be specific (ids, names, numbers); omit pleasantries."
)


def new_thread_id() -> str:
    return f"thr_{uuid.uuid4().hex[:20]}"


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


def _needs_compaction(agent: Agent, model: Model, thread: ThreadInfo) -> bool:
    return thread.usage.total_tokens > agent.compact_at * model.context_window


def _instructions(agent: Agent, thread: ThreadInfo) -> str:
    """The agent's instructions, plus what a temporary event thread must know."""
    if thread.metadata.get("role") != "event":
        return agent.instructions
    note = (
        f"You are temporary thread {thread.id}, processing one event on subscription "
        f"{thread.metadata.get('subscription')} for thread {thread.parent_id}. Your output is not "
        "seen by anyone: use report_to_parent if the parent should know, then close_thread."
    )
    return f"{agent.instructions}\n\n{note}".strip()


def _status(thread: ThreadInfo, applied: Applied, turn: _Turn) -> ThreadStatus:
    if thread.status is ThreadStatus.CLOSED or turn.closing:
        return ThreadStatus.CLOSED
    if pending(applied.calls):
        return ThreadStatus.WAITING
    if thread.metadata.get("role") == "event" and applied.woke:
        return ThreadStatus.CLOSED  # a temporary thread that went idle has nothing left to do
    return ThreadStatus.IDLE


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
