"""How a slice records what went wrong: a failed slice (backoff, stall), a quarantined
row, a deadline passed, a history too large. Split from ``slice.py``."""

from __future__ import annotations

from datetime import datetime, timedelta

from dormant.errors import BudgetExceeded, HistoryTooLarge, ModelFatal, SliceDeadlineExceeded
from dormant.messages import (
    AssistantTurn,
    Event,
    EventShown,
    Rejected,
    StatusChanged,
    Summary,
    ToolResult,
    UserText,
)
from dormant.runtime.deps import SliceDeps
from dormant.runtime.outcomes import Failed
from dormant.runtime.quarantine import REQUEST_STATUSES, history_bytes
from dormant.stores.base import InboxRow, Snapshot, StoredItem, ThreadStatus
from dormant.stores.rawitem import RawStoredItem

__all__ = [
    "check_deadline",
    "check_history_size",
    "describe",
    "history_bytes_bound",
    "quarantine_row",
    "record_failed",
    "stalls_at_once",
]


def describe(error: BaseException) -> str:
    """The last line of the error's traceback, without the module (``KeyError: 'choices'``,
    ``ModelFatal: 401 ...``), for ``last_error``; a spent budget says ``budget: ...``."""
    if isinstance(error, BudgetExceeded):
        return str(error)
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[-1]}" if text else type(error).__name__


def stalls_at_once(error: Exception) -> bool:
    """Whether the failure stalls its thread at once: a provider refusing the deployment
    (``ModelFatal`` other than 400, 413 or 422: a bad or missing key, a model it does not
    serve) refuses every retry the same way until an operator fixes it, so retrying only
    hides the reason behind a backoff. A refused request blames one message instead and
    goes the way of quarantine (``quarantine.py``). A spent budget stops the thread until
    an operator raises it: retrying would spend more or meet the same limit."""
    if isinstance(error, BudgetExceeded):
        return True
    return isinstance(error, ModelFatal) and error.status not in REQUEST_STATUSES


def record_failed(
    deps: SliceDeps,
    thread_id: str,
    failures: int,
    error: str,
    events: list[Event],
    stall_after: int | None = None,
) -> Failed:
    """Record a failed slice: nothing was consumed; the next try waits (backoff)."""
    settings = deps.settings
    wait_s = min(settings.failure_backoff_max_s, settings.failure_backoff_s * 2**failures)
    retry_at = deps.clock() + timedelta(seconds=wait_s)
    info = deps.store.record_failure(
        thread_id, error, stall_after or settings.stall_after_failures, retry_at
    )
    stalled = info.status is ThreadStatus.STALLED
    if stalled:
        events.append(
            StatusChanged(thread_id=thread_id, status=info.status, detail=info.last_error)
        )
    return Failed(thread_id, info.last_error, stalled, retry_at)


def quarantine_row(
    deps: SliceDeps, snap: Snapshot, row: InboxRow, error: str, events: list[Event]
) -> Failed:
    """Set the poison row aside; the thread goes on with its other input at once."""
    thread_id = snap.thread.id
    failures = snap.thread.failures + 1
    reason = f"quarantined after {failures} failed slices: {error}"
    deps.store.quarantine(thread_id, row.id, reason)
    events.append(Rejected(thread_id=thread_id, message_id=row.message_id, reason=reason))
    detail = f"message {row.message_id!r} {reason}"
    return Failed(thread_id, detail, stalled=False, quarantined=row.message_id)


def check_deadline(deps: SliceDeps, thread_id: str, started_at: datetime) -> None:
    """Abandon a slice that ran past ``slice_deadline_s`` (checked between steps)."""
    deadline_s = deps.settings.slice_deadline_s
    if deadline_s <= 0:
        return
    elapsed_s = (deps.clock() - started_at).total_seconds()
    if elapsed_s > deadline_s:
        raise SliceDeadlineExceeded(thread_id, elapsed_s, deadline_s)


def check_history_size(deps: SliceDeps, thread_id: str, visible: list[StoredItem]) -> None:
    """Refuse a history past ``max_history_bytes`` (the JSON of its items).

    Serialising the whole history every slice cost more than decoding it (about 0.1 ms a
    completion at 20 turns), so a bound computed from string lengths comes first, and
    the exact size only when the bound passes the limit.
    """
    limit_bytes = deps.settings.max_history_bytes
    if limit_bytes <= 0 or history_bytes_bound(visible) <= limit_bytes:
        return
    if (size_bytes := history_bytes(visible)) > limit_bytes:
        raise HistoryTooLarge(thread_id, size_bytes, limit_bytes)


_ESCAPED = 6
"""JSON spends at most 6 bytes on a character (``\\u001f``; non-ASCII is raw UTF-8, at
most 4)."""
_FRAME = 128
"""More than the keys, tags, quotes and numbers of any item or call around its strings."""


def history_bytes_bound(items: list[StoredItem]) -> int:
    """An upper bound of ``history_bytes(items)``, from lengths alone (no serialisation).

    A dict of call arguments is bounded by its ``repr``: every character of it costs at
    most ``_ESCAPED`` bytes in JSON, and JSON's punctuation is never longer than repr's.
    """
    chars = 0
    frames = 0
    exact = 0
    for stored in items:
        if type(stored) is RawStoredItem:  # its JSON as stored: the exact size, undecoded
            exact += len(stored.raw)
            continue
        item = stored.item
        kind = type(item)  # by exact type: cheaper than isinstance, per item
        if kind is AssistantTurn:
            chars += len(item.text)  # type: ignore[union-attr]
            for call in item.calls:  # type: ignore[union-attr]
                chars += len(call.call_id) + len(call.name) + len(repr(call.args))
                frames += 1
        elif kind is UserText or kind is Summary:
            chars += len(item.text)  # type: ignore[union-attr]
        elif kind is ToolResult:
            chars += len(item.content) + len(item.call_id) + len(item.name)  # type: ignore[union-attr]
        elif kind is EventShown:
            chars += len(item.content) + len(item.call_id) + len(item.original_call_id)  # type: ignore[union-attr]
            chars += len(item.original_name) + len(repr(item.original_args))  # type: ignore[union-attr]
            frames += 1
        else:  # an item kind this bound does not know: its exact size
            chars += history_bytes([stored])
    return exact + _ESCAPED * chars + _FRAME * (frames + len(items))
