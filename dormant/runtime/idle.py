"""What ``LocalSystem.run_until_idle`` reports: threads that failed instead of finishing.

A failed slice consumes nothing: its messages stay queued, the thread waits (backoff) and
is tried again, and after ``stall_after_failures`` tries it is stalled until ``retry``. So
"idle" can mean "done" or "stuck"; this report tells the two apart, naming each stuck
thread and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dormant.stores.base import Store, ThreadInfo, ThreadStatus

__all__ = ["IdleReport", "ThreadFailure", "failed_threads"]


@dataclass(frozen=True, slots=True)
class ThreadFailure:
    """A thread that is stalled, or waiting to retry after a failed slice."""

    thread_id: str
    status: ThreadStatus
    failures: int
    """Consecutive failed slices."""
    error: str
    """The last failure, as recorded on the thread (``ThreadInfo.last_error``)."""
    retry_at: datetime | None
    """When the thread is tried again on its own; None once stalled (needs ``retry``)."""
    message_id: str | None = None
    """A message set aside as poison (quarantined); the thread went on without it."""

    def describe(self) -> str:
        last_line = next(
            (line for line in reversed(self.error.splitlines()) if line.strip()), "no error text"
        )
        if self.message_id is not None:
            state = f"message {self.message_id!r} quarantined; `retry` requeues it"
            return f"thread {self.thread_id!r} ({state}): {last_line}"
        if self.status is ThreadStatus.STALLED:
            state = f"stalled after {self.failures} failed slice(s); `retry` re-drives it"
        else:
            when = f" after {self.retry_at:%H:%M:%S} UTC" if self.retry_at else ""
            state = f"{self.failures} failed slice(s), retried{when}"
        return f"thread {self.thread_id!r} ({state}): {last_line}"


@dataclass(frozen=True, slots=True)
class IdleReport:
    """The outcome of ``run_until_idle``: empty ``failed`` means every thread finished
    its work or waits on something outside (a tool, a callback, a timer)."""

    failed: tuple[ThreadFailure, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failed

    def describe(self) -> str:
        if not self.failed:
            return "no thread failed"
        lines = [f"{len(self.failed)} thread(s) failed:"]
        lines += [f"  {failure.describe()}" for failure in self.failed]
        return "\n".join(lines)


def failed_threads(store: Store, since: datetime, limit: int = 100) -> IdleReport:
    """Threads that failed at or after ``since``: stalled, holding queued messages after a
    failed slice (the rows a failure leaves pending), or with a message quarantined (of a
    thread changed since: rows carry no time of their own)."""
    found: dict[str, ThreadInfo] = {}
    for info in store.threads(ThreadStatus.STALLED, limit):
        found[info.id] = info
    for thread_id in store.threads_to_wake(limit):  # without ``now``: backing off included
        if thread_id not in found:
            found[thread_id] = store.thread(thread_id)
    failures = [
        ThreadFailure(info.id, info.status, info.failures, info.last_error, info.retry_at)
        for info in found.values()
        if info.failures > 0 and info.updated_at >= since
    ]
    for row in store.quarantined(limit):
        info = store.thread(row.thread_id)
        if info.updated_at >= since:
            failures.append(
                ThreadFailure(info.id, info.status, 0, row.reason, None, row.message_id)
            )
    return IdleReport(tuple(sorted(failures, key=lambda f: f.thread_id)))
