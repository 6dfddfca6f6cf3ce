"""``run_slice``: one bounded unit of work for one thread (DESIGN section 4).

1. take the lease (or end: the holder drains the inbox); 2. load; 3-4. apply the pending
inbox rows (``history.apply_inbox``); 5. run at most one completion, buffered and retried,
looping only while every call of the turn was answered inside the slice (built-ins,
invalid calls), up to ``max_rounds_per_slice``; 6. validate each call; 7. commit once,
guarded by the thread's version; 8. dispatch the outbox; 9. end in one go (``SliceEnd``:
the applied ids to the dedup set, the buffered events, the lease's release) and re-wake if
a slice woken meanwhile was refused the lease.

SQL sees two transactions (load, commit) and a third, one statement, only to stamp the
dispatched outbox rows; Redis two round trips (acquire, end) plus a live chunk now and then
during a long completion.

A crash before 7 loses nothing (the rerun makes the one turn); a crash between 7 and 8
leaves undispatched outbox rows the sweeper re-dispatches.
"""

from __future__ import annotations

import logging
import time
import uuid

from dormant.agents import Agent
from dormant.errors import (
    BudgetExceeded,
    ControlSignal,
    CrashPoint,
    LeaseLost,
    ModelError,
    SteeredAway,
    Throttled,
    UnknownAgent,
    UnknownThread,
)
from dormant.messages import (
    AssistantTurn,
    Chunk,
    Event,
    ItemAdded,
    Rejected,
    StatusChanged,
    Summary,
    ToolDispatched,
    Usage,
)
from dormant.models.base import Completion, Model, ModelRequest
from dormant.runtime.admission import Caller, complete_admitted, defer
from dormant.runtime.budgets import Meter
from dormant.runtime.calls import fresh_ids, start_call
from dormant.runtime.children import (
    instructions_for,
    spawn_event_thread,
)
from dormant.runtime.compaction import COMPACTION_INSTRUCTIONS, needs_compaction, safe_seq
from dormant.runtime.deps import Dispatcher, EventSink, SeparateEnd, SliceDeps, SliceEnd
from dormant.runtime.failures import (
    check_deadline,
    check_history_size,
    describe,
    quarantine_row,
    record_failed,
    stalls_at_once,
)
from dormant.runtime.history import Applied, apply_inbox, has_pending
from dormant.runtime.outcomes import (
    Busy,
    Closed,
    Deferred,
    Failed,
    Idle,
    Missing,
    SliceOutcome,
    Stale,
    Stalled,
    Steered,
    Waiting,
    rewake_priority,
    settled,
    status_after,
    waiting_on,
)
from dormant.runtime.quarantine import isolate, poison
from dormant.runtime.turn import Turn
from dormant.stores.base import (
    CallState,
    Commit,
    InboxRow,
    OutboxRow,
    Priority,
    Snapshot,
    StoredItem,
    ThreadStatus,
)
from dormant.stores.closing import close_calls
from dormant.stores.lineage import compacted
from dormant.stores.rawitem import ItemsView
from dormant.tools.builtins import (
    BuiltinContext,
)

__all__ = [
    "Busy",
    "Closed",
    "Deferred",
    "Dispatcher",
    "EventSink",
    "Failed",
    "Idle",
    "Missing",
    "SeparateEnd",
    "SliceDeps",
    "SliceEnd",
    "SliceOutcome",
    "Stale",
    "Stalled",
    "Steered",
    "Waiting",
    "run_slice",
    "safe_seq",
]

log = logging.getLogger("dormant.slice")


# Outcomes ---------------------------------------------------------------------------------


def run_slice(thread_id: str, deps: SliceDeps) -> SliceOutcome:
    """Run one slice of ``thread_id``; see the module docstring for the steps.

    Any exception from the agent's code, its model or a bug (not a control signal) is a
    failed slice: nothing is committed, the error is recorded with a backoff and the thread
    stalls after ``stall_after_failures``. Only what cannot be recorded (the store is
    unreachable) propagates, logged here.
    """
    token = deps.lease.acquire(thread_id, deps.settings.lease_ttl_s)
    if token is None:
        return Busy(thread_id)  # the holder drains the inbox: its release sees the refusal
    work = _Slice(thread_id, token, deps)
    try:
        deps.crash("holding_lease")
        outcome, seen = work.run()
    except CrashPoint:
        raise  # a simulated death keeps the lease until it expires, like a real one
    except ControlSignal:
        work.end()
        raise
    except BaseException as error:
        if isinstance(error, Exception):
            log.error(  # the store is unreachable, or the work was committed before it
                "slice of thread %s raised; not recorded as a failed slice",
                thread_id,
                exc_info=True,
            )
        work.end()
        raise
    refused = work.end()
    # Rows that arrived during the slice woke a slice that was refused the lease (or one
    # still queued, which will run): only then, after steering, or when the slice set rows
    # aside, is SQL asked again.
    asked = seen is not None and (refused or work.set_aside or isinstance(outcome, Steered))
    if asked and seen is not None and deps.store.has_pending_after(thread_id, seen):
        priority = rewake_priority(deps.store, thread_id, seen)
        if not isinstance(outcome, Deferred) or priority is Priority.INTERACTIVE:
            deps.dispatcher.wake(thread_id, priority)  # a deferred one waits unless user text
    return outcome


class _Slice:
    def __init__(self, thread_id: str, token: str, deps: SliceDeps) -> None:
        self.thread_id = thread_id
        self.token = token
        self.deps = deps
        self.renewed_at = time.monotonic()
        self.steer_checked_at = time.monotonic()
        self.seen = 0
        self.steering = False
        self.streamed = ""
        self.attempts = 0
        self.boundary = 0
        """The seq the turn's first item gets: where its streamed text belongs."""
        """Completion attempts begun: with the lease token, names the chunks' attempt."""
        self.flushed_at = time.monotonic()
        self.next_check_at = 0.0
        """When ``_on_chunk`` next flushes and checks (monotonic seconds): the first
        chunk of a slice always does."""
        self.committed = False
        self.started_at = deps.clock()
        self.set_aside = False
        """Whether the slice left loaded rows for later (``isolate``): it wakes the thread
        again for them."""
        self.applied_ids: list[str] = []
        """Message ids of the inbox rows the commit marked done (for the dedup set)."""
        self.events: list[Event] = []
        """Events published when the slice ends, with the lease's release."""
        self.caller = Caller(thread_id, interactive=False, flow="")
        """Who asks for model capacity (``runtime/admission.py``), set once loaded."""

    def end(self) -> bool:
        """Publish the buffered events, remember the applied ids, release the lease."""
        return self.deps.end(self.thread_id, self.token, self.applied_ids, self.events)

    def run(self) -> tuple[SliceOutcome, int | None]:
        deps = self.deps
        try:
            snap = deps.store.load(self.thread_id)
        except UnknownThread:
            return Missing(self.thread_id), None
        except ControlSignal:
            raise
        except Exception as error:  # a row that no longer loads, say: record it if we can
            log.warning("loading thread %s failed", self.thread_id, exc_info=True)
            thread = deps.store.thread(self.thread_id)
            return self._failed(thread.failures, describe(error)), None
        self.boundary = snap.next_seq
        if snap.thread.status is ThreadStatus.STALLED:
            return Stalled(self.thread_id, snap.thread.last_error), None
        if not snap.inbox:
            return settled(self.thread_id, snap.thread.status, snap.calls), None
        loaded = len(snap.inbox)
        snap = isolate(snap)  # after a failure: one suspect row alone (quarantine.py)
        self.set_aside = len(snap.inbox) < loaded
        self.seen = max(row.id for row in snap.inbox)
        try:
            return self._apply(snap)
        except ControlSignal:
            raise
        except Exception as error:
            if self.committed:
                raise  # the slice's work is stored; what is left the sweeper re-drives
            # A provider's failure is expected and says all in one line; anything else is a
            # bug somewhere, and its traceback is what finds it.
            expected = isinstance(error, ModelError | BudgetExceeded)
            log.warning(
                "slice of thread %s failed: %s",
                self.thread_id,
                describe(error),
                exc_info=not expected,
            )
            suspect = poison(deps.settings, snap, error)
            if suspect is not None:
                return self._quarantine(snap, suspect, describe(error)), suspect.id
            stall_after = 1 if stalls_at_once(error) else None
            return self._failed(snap.thread.failures, describe(error), stall_after), None

    def _apply(self, snap: Snapshot) -> tuple[SliceOutcome, int | None]:
        deps = self.deps
        try:
            agent = deps.agents.get_agent(snap.thread.agent)
        except UnknownAgent as error:
            # A deployment without this agent can never run the thread: stall it visibly
            # (``retry`` once the agent is deployed) rather than fail on every sweep.
            failed = self._failed(snap.thread.failures, f"{error} in this worker", stall_after=1)
            return failed, None
        self.steering = agent.steering == "interrupt"
        applied = apply_inbox(snap.thread, snap.calls, snap.inbox)
        turn = Turn(snap.next_seq)
        for message_id, item in applied.items:
            turn.add(message_id, item)
        for spawn in applied.spawns:
            spawn_event_thread(agent, snap, turn, spawn)
        if applied.needs_completion:
            interactive = any(row.priority >= Priority.INTERACTIVE for row in snap.inbox)
            flow = str(snap.thread.metadata.get("tenant") or agent.name)
            self.caller = Caller(self.thread_id, interactive, flow, agent.weight)
            try:
                self._converse(agent, snap, applied, turn)
            except SteeredAway:
                return Steered(self.thread_id), self.seen
            except Throttled as throttled:  # nothing consumed; woken when capacity is back
                return defer(deps, throttled), self.seen
        committed = self._commit(snap, applied, turn)
        if turn.meter is not None and turn.meter.stopped and self.committed:
            return self._failed(0, turn.meter.stopped, stall_after=1), committed[1]
        return committed

    def _failed(self, failures: int, error: str, stall_after: int | None = None) -> Failed:
        return record_failed(self.deps, self.thread_id, failures, error, self.events, stall_after)

    def _quarantine(self, snap: Snapshot, row: InboxRow, error: str) -> Failed:
        return quarantine_row(self.deps, snap, row, error, self.events)

    def _check_deadline(self) -> None:
        check_deadline(self.deps, self.thread_id, self.started_at)

    # step 5-6 -------------------------------------------------------------------------

    def _converse(self, agent: Agent, snap: Snapshot, applied: Applied, turn: Turn) -> None:
        deps = self.deps
        model = agent.resolved_model()
        meter = turn.meter = Meter.start(deps.store, agent, model, snap.thread, turn.items)
        visible = [*snap.items, *turn.items]
        if needs_compaction(agent, model, snap.thread):
            visible = self._compact(agent, model, snap.items, visible, turn, meter)
        check_history_size(deps, self.thread_id, visible)
        instructions = instructions_for(agent, snap.thread)
        for _ in range(deps.settings.max_rounds_per_slice):
            self._check_deadline()
            if not meter.allows_another():
                return
            request = ModelRequest(
                self.thread_id,
                instructions,
                ItemsView(visible),  # decoded only where the model reads an item
                agent.specs(snap.thread, applied.calls.values()),
                meter.settings(agent.model_settings),
            )
            completion = self._complete(model, request)
            meter.charge(completion.usage)
            deps.crash("after_model")
            calls = fresh_ids(completion.calls, applied.calls)
            # The seq makes the id unique in the thread; 8 random hex digits keep a sender's
            # own message id from ever colliding with it by accident. A whole uuid cost ~16
            # incompressible bytes an item in every stored history.
            message_id = f"turn:{turn.free_seq}:{uuid.uuid4().hex[:8]}"
            assistant = turn.add(message_id, AssistantTurn(text=completion.text, calls=calls))
            visible.append(assistant)
            turn.usage = completion.usage
            ctx = BuiltinContext(
                snap.thread,
                applied.calls,
                lambda: deps.store.children(self.thread_id),
                deps.clock(),
            )
            for call in calls:
                result = start_call(agent, call, assistant.seq, applied, turn, ctx)
                if result is not None:
                    visible.append(turn.add(f"{call.call_id}:result", result))
            if not calls or turn.closing or has_pending(applied.calls):
                return

    def _complete(self, model: Model, request: ModelRequest) -> Completion:
        self._keep_lease(time.monotonic())
        try:
            return complete_admitted(
                self.deps, self.caller, model, request, self._on_chunk, self._between_attempts
            )
        finally:  # the rest of the text goes out with the slice's other events
            if self.streamed:
                self.events.append(self._chunk())
                self.streamed = ""
            self.flushed_at = time.monotonic()

    def _compact(
        self,
        agent: Agent,
        model: Model,
        committed: list[StoredItem],
        visible: list[StoredItem],
        turn: Turn,
        meter: Meter,
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
        meter.check()
        completion = self._complete(model, request)
        meter.charge(completion.usage, summary=True)
        summary = Summary(text=completion.text, upto_seq=upto)
        stored = turn.add(f"summary:{uuid.uuid4().hex}", summary)
        turn.usage = Usage()  # the old count no longer describes the history (a536c9f)
        return compacted([*visible, stored])

    def _flush_chunks(self, now: float) -> None:
        """Publish the text streamed since the last flush as one chunk, now (a live view of
        a long completion)."""
        if self.streamed:
            self.deps.events.publish(self._chunk())
            self.streamed = ""
        self.flushed_at = now

    def _chunk(self) -> Chunk:
        # "<boundary>:<slice start, ms>:<lease token>:<model attempt>". A log that moved
        # past the boundary (the commit's items are in) drops the chunk, which the item
        # holds; of two attempts, the one begun later wins (a slice whose lease was lost
        # may stream on a moment beside its successor).
        started_ms = int(self.started_at.timestamp() * 1000)
        attempt = f"{self.boundary}:{started_ms}:{self.token[:8]}:{self.attempts}"
        return Chunk(thread_id=self.thread_id, text=self.streamed, attempt=attempt)

    def _between_attempts(self, wait_s: float) -> None:
        """A model attempt failed: its text goes out as its own, the next is another."""
        self._flush_chunks(time.monotonic())
        self.attempts += 1
        self.deps.sleep(wait_s)

    def _keep_lease(self, now: float) -> None:
        """Renew the lease once a third of its time-to-live has passed."""
        ttl_s = self.deps.settings.lease_ttl_s
        if now - self.renewed_at > ttl_s / 3:
            if not self.deps.lease.renew(self.thread_id, self.token, ttl_s):
                raise LeaseLost(self.thread_id)
            self.renewed_at = now

    def _on_chunk(self, text: str) -> None:
        """Buffer streamed text; now and then (``_tick_s``) flush it, renew the lease,
        check the deadline and look for steering. Between those, a chunk costs one look
        at the monotonic clock: 25 chunks a completion made the checks a cost of their own.
        """
        self.streamed += text
        now = time.monotonic()
        if now >= self.next_check_at:
            self._check_stream(now)

    def _check_stream(self, now: float) -> None:
        deps = self.deps
        settings = deps.settings
        if now - self.flushed_at >= settings.chunk_flush_s:
            self._flush_chunks(now)
        self._keep_lease(now)
        self._check_deadline()
        if self.steering and now - self.steer_checked_at >= settings.steer_check_s:
            self.steer_checked_at = now
            if deps.store.has_pending_after(self.thread_id, self.seen, user_text_only=True):
                raise SteeredAway(self.thread_id)
        self.next_check_at = now + self._tick_s()

    def _tick_s(self) -> float:
        """How long streaming goes unchecked: the shortest of the flush interval, a third
        of the lease's time-to-live and (when steering) the steering interval."""
        settings = self.deps.settings
        tick_s = min(settings.chunk_flush_s, settings.lease_ttl_s / 3)
        return min(tick_s, settings.steer_check_s) if self.steering else tick_s

    # steps 7-8 ------------------------------------------------------------------------

    def _commit(
        self, snap: Snapshot, applied: Applied, turn: Turn
    ) -> tuple[SliceOutcome, int | None]:
        deps = self.deps
        thread = snap.thread
        status = status_after(thread, applied, turn)
        closing = status is ThreadStatus.CLOSED and thread.status is not ThreadStatus.CLOSED
        if closing:
            changed, results = close_calls(thread.id, applied.calls.values(), turn.free_seq)
            for record in changed:
                applied.set_state(record, record.state)
            turn.items += results
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
            close_descendants=closing,
            enqueue=turn.enqueue,
            usage=turn.usage,
            spend=turn.meter.spend if turn.meter else None,
            message_completions=turn.meter.message_completions if turn.meter else None,
        )
        self._check_deadline()
        deps.crash("before_commit")
        rows = deps.store.commit(commit)
        if rows is None:
            return Stale(self.thread_id), None
        self.committed = True
        deps.crash("after_commit")
        self._after_commit(snap, applied, turn, status, rows)
        return settled(self.thread_id, status, applied.calls), self.seen

    def _after_commit(
        self,
        snap: Snapshot,
        applied: Applied,
        turn: Turn,
        status: ThreadStatus,
        rows: list[OutboxRow],
    ) -> None:
        deps = self.deps
        done = set(applied.done)
        self.applied_ids = [r.message_id for r in snap.inbox if r.id in done]
        events = self.events
        events += [ItemAdded(thread_id=self.thread_id, seq=s.seq, item=s.item) for s in turn.items]
        events += [
            Rejected(thread_id=self.thread_id, message_id=row.message_id, reason=reason)
            for row, reason in applied.rejected
        ]
        if status is not snap.thread.status:
            detail = waiting_on(applied) if status is ThreadStatus.WAITING else ""
            events.append(StatusChanged(thread_id=self.thread_id, status=status, detail=detail))
        for thread_id in {t for t, *_ in turn.enqueue}:
            deps.dispatcher.wake(thread_id, Priority.BACKGROUND)
        for outbox in rows:
            deps.dispatcher.dispatch(outbox)
            known = applied.calls.get(outbox.call_id)
            name = known.name if known and outbox.thread_id == self.thread_id else outbox.action
            events.append(
                ToolDispatched(thread_id=outbox.thread_id, call_id=outbox.call_id, name=name)
            )
        if rows:  # one stamp for all: a row sent but not stamped is only sent again
            deps.store.mark_dispatched([outbox.id for outbox in rows])
