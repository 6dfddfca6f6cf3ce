"""Steps 7-8 of a slice (``runtime/slice.py``): commit the turn in one transaction guarded
by the thread's version, then tell and dispatch what it wrote.

The commit carries the turn's items, changed calls, inbox rows marked done, rejected or
deferred, outbox rows, timers (and the timers of passive calls that stopped), new
threads and messages to other threads (and, when the turn closes the thread, its open
calls closed and its descendants with it); a version that moved makes the slice ``Stale``
(``Closed`` when a close moved it).
After it: the events (items, rejections, a status change, dispatched tools), wake-ups for
the threads written to, and one stamp for every outbox row dispatched.

``SliceCommit`` is mixed into the slice (``_Slice``), which sets its attributes.
"""

from __future__ import annotations

from dormant.messages import (
    Event,
    ItemAdded,
    Rejected,
    StatusChanged,
    Summary,
    ToolDispatched,
    Usage,
)
from dormant.runtime.deps import SliceDeps
from dormant.runtime.history import Applied
from dormant.runtime.outcomes import (
    Closed,
    SliceOutcome,
    Stale,
    settled,
    status_after,
    waiting_on,
)
from dormant.runtime.turn import Turn
from dormant.stores.base import (
    CallState,
    Commit,
    OutboxRow,
    Priority,
    Snapshot,
    StoredItem,
    ThreadStatus,
    VersionChange,
)
from dormant.stores.closing import close_calls
from dormant.tracing import SliceTrace

__all__ = ["SliceCommit", "version_change"]


class SliceCommit:
    thread_id: str
    deps: SliceDeps
    seen: int
    committed: bool
    applied_ids: list[str]
    events: list[Event]
    trace: SliceTrace

    def _check_deadline(self) -> None:
        raise NotImplementedError

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
            cancel_timers=stopped + turn.cancel_timers,
            threads=turn.threads,
            close_descendants=closing,
            enqueue=turn.enqueue,
            usage=turn.usage,
            spend=turn.meter.spend if turn.meter else None,
            message_completions=turn.meter.message_completions if turn.meter else None,
            code_version=turn.code_version,
            version_change=version_change(thread.code_version, turn),
            trace=self.trace.carrier(),
        )
        self._check_deadline()
        deps.crash("before_commit")
        rows = deps.store.commit(commit)
        if rows is None:
            return self._overtaken(), None
        self.committed = True
        self.trace.committed(turn.next_seq, turn.free_seq - 1, turn.code_version)
        deps.crash("after_commit")
        self._after_commit(snap, applied, turn, status, rows)
        return settled(self.thread_id, status, applied.calls), self.seen

    def _overtaken(self) -> SliceOutcome:
        """The outcome of a commit whose version moved: ``Closed`` if a close moved it
        (so the slice is reported as stopped by the close, not by a race), else
        ``Stale``."""
        if self.deps.store.thread(self.thread_id).status is ThreadStatus.CLOSED:
            return Closed(self.thread_id)
        return Stale(self.thread_id)

    def _keep_summary(self, snap: Snapshot, turn: Turn) -> SliceOutcome | None:
        """Commit only the compaction summary this slice paid for, and what it spent, when
        the budget then refused the reply it was made for: nothing else of the turn (the
        input stays queued, its status unchanged). Dropped, the summary would be paid for
        again on every retry and never counted. None once committed, else the outcome of
        a version that moved (``_overtaken``)."""
        summary = next(s for s in turn.items if isinstance(s.item, Summary))
        assert turn.meter is not None
        commit = Commit(
            thread_id=self.thread_id,
            version=snap.thread.version,
            status=snap.thread.status,
            inbox_seen=snap.thread.inbox_seen,
            items=[StoredItem(snap.next_seq, summary.message_id, summary.item)],
            usage=Usage(),  # the old count no longer describes the history
            spend=turn.meter.spend,
            message_completions=snap.thread.message_completions,  # a summary is no reply
        )
        self._check_deadline()
        if self.deps.store.commit(commit) is None:
            return self._overtaken()
        self.committed = True
        self.events += [
            ItemAdded(thread_id=self.thread_id, seq=s.seq, item=s.item) for s in commit.items
        ]
        return None

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
        for thread_id in {t for t, *_ in turn.enqueue} - {self.thread_id}:
            deps.dispatcher.wake(thread_id, Priority.BACKGROUND)  # its own: held back
        if turn.continues:  # out of rounds, not stopped: the next slice goes on
            deps.dispatcher.wake(self.thread_id, Priority.BACKGROUND)
        for outbox in rows:
            deps.dispatcher.dispatch(outbox)
            known = applied.calls.get(outbox.call_id)
            name = known.name if known and outbox.thread_id == self.thread_id else outbox.action
            events.append(
                ToolDispatched(thread_id=outbox.thread_id, call_id=outbox.call_id, name=name)
            )
        if rows:  # one stamp for all: a row sent but not stamped is only sent again
            deps.store.mark_dispatched([outbox.id for outbox in rows])


def version_change(last: str, turn: Turn) -> VersionChange | None:
    """What the commit says when the slice ran another version than the thread's last
    slice (a deploy came between): nothing for a thread's first slice, one no version
    ran yet, or a slice that does not say its version (a close)."""
    if not last or not turn.code_version or turn.code_version == last:
        return None
    return VersionChange(turn.next_seq, last)
