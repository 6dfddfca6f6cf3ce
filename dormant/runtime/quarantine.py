"""Poison messages: find the one input a thread keeps failing on, and set it aside.

A slice applies every queued message at once, so when it fails nobody knows which input
is to blame. After a first failure the thread's next slices take its oldest waiting row
alone (``isolate``): if the slice still fails with that row alone, the row is the suspect,
and after ``quarantine_after_failures`` consecutive failures it is quarantined
(``poison``): its inbox row is set aside with the error, and the thread goes on with the
rest of its input at once. ``retry`` puts it back.

Only input whose absence leaves a valid history is quarantined: user text, a parent's
message, events and child reports (each is an independent addition), and a result for a
call that is no longer pending (a late result, shown as an event). A result for a pending
call is never set aside: the call would stay without its result and the model could not
go on, so such a thread stalls as before, with its error, until an operator's ``retry``.
A provider's transient failure (``ModelRetryable``: rate limits, 5xx, dropped streams),
a provider refusing the deployment rather than the request (``ModelFatal`` other than
400, 413 or 422: a bad key, an unknown model) and a history past ``max_history_bytes``
(the thread's, not one message's) blame no message either: they count towards stalling,
never towards quarantine.
"""

from __future__ import annotations

from dataclasses import replace

from dormant.errors import BudgetExceeded, HistoryTooLarge, ModelFatal, ModelRetryable
from dormant.messages import ItemAdapter, ToolResultMessage
from dormant.settings import Settings
from dormant.stores.base import CallRecord, CallState, InboxRow, InboxState, Snapshot, StoredItem

__all__ = ["history_bytes", "isolate", "poison", "quarantinable"]


def isolate(snap: Snapshot) -> Snapshot:
    """After a failed slice, the snapshot with one suspect row as its only input: the
    oldest pending row (the oldest deferred one if none is pending)."""
    if snap.thread.failures == 0 or len(snap.inbox) <= 1:
        return snap
    pending = [row for row in snap.inbox if row.state is InboxState.PENDING]
    return replace(snap, inbox=[(pending or snap.inbox)[0]])


def quarantinable(row: InboxRow, calls: dict[str, CallRecord]) -> bool:
    """Whether the history stays valid without ``row`` (see the module docstring)."""
    if not isinstance(row.message, ToolResultMessage):
        return True
    call = calls.get(row.message.call_id)
    return call is None or call.state is not CallState.PENDING


def poison(settings: Settings, snap: Snapshot, error: Exception) -> InboxRow | None:
    """The row to quarantine after this failed slice of ``snap`` (isolated), if any."""
    after = settings.quarantine_after_failures
    if not 0 < after < settings.stall_after_failures:
        return None  # off, or stalling comes first: the operator decides
    if len(snap.inbox) != 1 or not _blames_input(error):
        return None
    if snap.thread.failures + 1 < after:
        return None
    row = snap.inbox[0]
    return row if quarantinable(row, snap.calls) else None


REQUEST_STATUSES = frozenset({400, 413, 422})
"""Provider statuses that say the request itself (so, possibly, one message) was refused."""


def _blames_input(error: Exception) -> bool:
    """Whether the failure may be the input's fault: not a provider outage, not the
    thread's size, not a provider refusing the deployment (a bad key, an unknown model)."""
    if isinstance(error, ModelRetryable | HistoryTooLarge | BudgetExceeded):
        return False
    if isinstance(error, ModelFatal):
        return error.status in REQUEST_STATUSES
    return True


def history_bytes(items: list[StoredItem]) -> int:
    """The size of a history as the JSON of its items (what ``max_history_bytes`` bounds)."""
    return sum(len(ItemAdapter.dump_json(stored.item)) for stored in items)
