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
during a long completion, and the lease's renewal every third of its time-to-live, from the
process's keeper thread (``lease_keeper.py``).

A crash before 7 loses nothing (the rerun makes the one turn); a crash between 7 and 8
leaves undispatched outbox rows the sweeper re-dispatches.

The slice's watch while its model streams (chunks, lease, deadline, steering) is
``watch.py``; steps 7-8 are ``commit.py``: both mixed into ``_Slice``.
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
    ModelError,
    SteeredAway,
    Throttled,
    UnknownAgent,
    UnknownThread,
)
from dormant.messages import (
    AssistantTurn,
    Event,
    Summary,
    Usage,
)
from dormant.models.base import Model, ModelRequest
from dormant.replay.agent import feed, replayed
from dormant.runtime.admission import Caller, defer, flow_of, line_of
from dormant.runtime.approvals import ApprovalDesk
from dormant.runtime.budgets import Meter
from dormant.runtime.calls import fresh_ids, hold_back, start_call
from dormant.runtime.children import (
    instructions_for,
    spawn_event_thread,
)
from dormant.runtime.commit import SliceCommit
from dormant.runtime.compaction import COMPACTION_INSTRUCTIONS, needs_compaction, safe_seq
from dormant.runtime.deps import Dispatcher, EventSink, SeparateEnd, SliceDeps, SliceEnd
from dormant.runtime.failures import (
    check_history_size,
    describe,
    quarantine_row,
    record_failed,
    stalls_at_once,
)
from dormant.runtime.history import Applied, apply_inbox, has_pending
from dormant.runtime.lease_keeper import Hold, keeper
from dormant.runtime.outcomes import (
    Busy,
    Closed,
    Deferred,
    Failed,
    Idle,
    Left,
    Missing,
    SliceOutcome,
    Stale,
    Stalled,
    Steered,
    Waiting,
    rewake_priority,
    settled,
)
from dormant.runtime.quarantine import isolate, poison
from dormant.runtime.turn import Turn
from dormant.runtime.watch import SliceWatch
from dormant.runtime.whereabouts import Elsewhere, leave, locate_agent, newer_code
from dormant.stores.base import (
    InboxRow,
    Priority,
    Snapshot,
    StoredItem,
    ThreadStatus,
)
from dormant.stores.lineage import compacted
from dormant.stores.rawitem import ItemsView
from dormant.tools.builtins import (
    BuiltinContext,
)
from dormant.tracing import UNTRACED, SliceTrace, start_slice

__all__ = [
    "Busy",
    "Closed",
    "Deferred",
    "Dispatcher",
    "EventSink",
    "Failed",
    "Idle",
    "Left",
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


def run_slice(thread_id: str, deps: SliceDeps, *, redelivered: bool = False) -> SliceOutcome:
    """Run one slice of ``thread_id``; see the module docstring for the steps.

    ``redelivered``: the broker handed this slice's task on from a worker that died with
    it (its trace marks the slice, which explains a second model call in the turn).

    Any exception from the agent's code, its model or a bug (not a control signal) is a
    failed slice: nothing is committed, the error is recorded with a backoff and the thread
    stalls after ``stall_after_failures``. Only what cannot be recorded (the store is
    unreachable) propagates, logged here.
    """
    ttl_s = deps.settings.lease_ttl_s
    token = deps.lease.acquire(thread_id, ttl_s)
    if token is None:
        return Busy(thread_id)  # the holder drains the inbox: its release sees the refusal
    deadline_s = deps.settings.slice_deadline_s
    with keeper.keep(deps.lease, thread_id, token, ttl_s, deadline_s or None) as hold:
        return _run(_Slice(thread_id, token, hold, deps, redelivered), deps)


def _run(work: _Slice, deps: SliceDeps) -> SliceOutcome:
    """Run ``work`` while its lease is kept; end it (release the lease, publish its
    events) however it ends, but for a simulated death."""
    thread_id = work.thread_id
    try:
        deps.crash("holding_lease")
        outcome, seen = work.run()
    except CrashPoint:
        raise  # a simulated death keeps the lease until it expires, like a real one
    except ControlSignal as signal:
        try:
            work.end()
        finally:
            work.trace.fail(signal)  # a span ends even when the end's Redis call fails
        raise
    except BaseException as error:
        if isinstance(error, Exception):
            log.error(  # the store is unreachable, or the work was committed before it
                "slice of thread %s raised; not recorded as a failed slice",
                thread_id,
                exc_info=True,
            )
        try:
            work.end()
        finally:
            work.trace.fail(error)
        raise
    try:
        refused = work.end()
    finally:
        work.trace.end(outcome)
    # Rows that arrived during the slice woke a slice that was refused the lease (or one
    # still queued, which will run): only then, after steering, or when the slice set rows
    # aside, is SQL asked again.
    asked = seen is not None and (refused or work.set_aside or isinstance(outcome, Steered))
    if asked and seen is not None and deps.store.has_pending_after(thread_id, seen):
        priority = rewake_priority(deps.store, thread_id, seen)
        if not isinstance(outcome, Deferred) or priority is Priority.INTERACTIVE:
            deps.dispatcher.wake(thread_id, priority)  # a deferred one waits unless user text
    return outcome


class _Slice(SliceWatch, SliceCommit):
    def __init__(
        self, thread_id: str, token: str, hold: Hold, deps: SliceDeps, redelivered: bool
    ) -> None:
        self.thread_id = thread_id
        self.redelivered = redelivered
        self.token = token
        self.hold = hold
        self.deps = deps
        self.steer_checked_at = time.monotonic()
        self.seen = 0
        self.steering = False
        self.streamed = ""
        self.attempts = 0
        self.boundary = 0
        self.flushed_at = time.monotonic()
        self.next_check_at = 0.0
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
        self.trace: SliceTrace = UNTRACED
        """The slice's span (``dormant.tracing``), started once it has input to apply."""

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
        self.trace = start_slice(deps.settings, snap, self.redelivered)
        try:
            return self._apply(snap)
        except ControlSignal:
            raise
        except Exception as error:
            if self.committed:
                raise  # the slice's work is stored; what is left the sweeper re-drives
            return self._fail(snap, error)

    def _fail(self, snap: Snapshot, error: Exception) -> tuple[SliceOutcome, int | None]:
        """Record a slice that failed: a failure counted (stalled at once for what no
        retry mends), or its suspect message quarantined."""
        # A provider's failure is expected and says all in one line; anything else is a
        # bug somewhere, and its traceback is what finds it.
        expected = isinstance(error, ModelError | BudgetExceeded)
        log.warning(
            "slice of thread %s failed: %s",
            self.thread_id,
            describe(error),
            exc_info=not expected,
        )
        suspect = poison(self.deps.settings, snap, error)
        if suspect is not None:
            return self._quarantine(snap, suspect, describe(error)), suspect.id
        stall_after = 1 if stalls_at_once(error) else None
        return self._failed(snap.thread.failures, describe(error), stall_after), None

    def _apply(self, snap: Snapshot) -> tuple[SliceOutcome, int | None]:
        deps = self.deps
        try:
            agent = deps.agents.get_agent(snap.thread.agent)
        except UnknownAgent as error:
            # Never answer for code this process does not have: leave the thread to a
            # worker that has its agent; only an agent gone from every worker stalls it
            # (``retry`` once the agent is deployed), visibly, rather than fail each sweep.
            where = locate_agent(deps, snap, error)
            if isinstance(where, Elsewhere):
                return leave(deps, self.thread_id, where.why, self.seen), None
            return self._failed(snap.thread.failures, where.why, stall_after=1), None
        newer = newer_code(deps, snap)
        if newer is not None:
            return leave(deps, self.thread_id, newer.why, self.seen), None
        self.steering = agent.steering == "interrupt"
        turn = Turn(snap.next_seq, code_version=agent.fingerprint)
        desk = ApprovalDesk.open(agent, snap, turn)
        applied = apply_inbox(snap.thread, snap.calls, snap.inbox, decide=desk.decide)
        desk.settle(applied)
        agent = replayed(agent, snap.thread, deps.store)  # a replay's overrides and record
        for message_id, item in applied.items:
            turn.add(message_id, item)
        for spawn in applied.spawns:
            spawn_event_thread(agent, snap, turn, spawn)
        if applied.needs_completion:
            interactive = any(row.priority >= Priority.INTERACTIVE for row in snap.inbox)
            flow = flow_of(agent.name, snap.thread.metadata)
            line = line_of(agent.name, flow)
            self.caller = Caller(self.thread_id, interactive, flow, agent.weight, line)
            try:
                self._converse(agent, snap, applied, turn)
            except SteeredAway:
                return Steered(self.thread_id), self.seen
            except Throttled as throttled:  # nothing consumed; woken when capacity is back
                self.trace.event("dormant.admission.wait", {"dormant.wait_s": throttled.wait_s})
                return defer(deps, throttled, self.seen), self.seen
            except (BudgetExceeded, ModelError) as error:
                if isinstance(error, BudgetExceeded):
                    self.trace.event("dormant.budget.stop", {"dormant.reason": str(error)})
                if not paid_summary(turn):
                    raise  # nothing was paid for: nothing to keep
                # A compaction was, then the budget refused its reply or the model failed
                # on it: keep the summary, so that no retry pays for it again.
                overtaken = self._keep_summary(snap, turn)
                if overtaken is not None:
                    return overtaken, None
                return self._fail(snap, error)
        # A replay's next recorded inputs, queued with this turn.
        turn.enqueue += feed(agent, snap, turn.items, applied.calls, turn.closing)
        committed = self._commit(snap, applied, turn)
        if turn.meter is not None and turn.meter.stopped and self.committed:
            self.trace.event("dormant.budget.stop", {"dormant.reason": turn.meter.stopped})
            return self._failed(0, turn.meter.stopped, stall_after=1), committed[1]
        return committed

    def _failed(self, failures: int, error: str, stall_after: int | None = None) -> Failed:
        return record_failed(self.deps, self.thread_id, failures, error, self.events, stall_after)

    def _quarantine(self, snap: Snapshot, row: InboxRow, error: str) -> Failed:
        return quarantine_row(self.deps, snap, row, error, self.events)

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
        answered: list[StoredItem] = []
        for _ in range(deps.settings.max_rounds_per_slice):
            self._check_deadline()
            if not meter.allows_another():
                hold_back(self.thread_id, answered, applied, turn)
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
            answered = []
            for call in calls:
                result = start_call(agent, call, assistant.seq, applied, turn, ctx)
                if result is not None:
                    answered.append(turn.add(f"{call.call_id}:result", result))
            visible += answered
            if not calls or turn.closing or has_pending(applied.calls):
                return
        # The rounds ran out on results the model has not read: they go to the thread's
        # inbox, and the next slice, woken at once, shows them to the model. Committed as
        # items, they would leave the thread idle with calls the model never saw answered.
        hold_back(self.thread_id, answered, applied, turn)
        turn.continues = bool(answered)

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


def paid_summary(turn: Turn) -> bool:
    """Whether the slice paid for a compaction summary it has not committed."""
    return turn.meter is not None and any(isinstance(s.item, Summary) for s in turn.items)
