"""Drive one slice at a time through the in-memory parts (huey's ``execute_next`` style)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from dormant.agents import Agent, AgentRegistry
from dormant.base_client import BaseClient
from dormant.errors import CrashPoint
from dormant.messages import Event, Item, ToolResult, UserText
from dormant.models.base import Completion
from dormant.runtime.slice import SliceDeps, SliceOutcome, run_slice
from dormant.settings import Settings
from dormant.stores.base import OutboxRow, Store
from dormant.stores.memory.store import MemoryStore
from dormant.stores.memory.sync import MemoryDedup, MemoryLease
from dormant.tools.runner import execute_outbox


class Harness(BaseClient):
    """A client whose wake-ups and dispatches are recorded, and run only when asked."""

    def __init__(
        self, *agents: Agent, settings: Settings | None = None, store: Store | None = None
    ) -> None:
        settings = (settings or Settings(model_backoff_s=0.0)).with_ephemeral_secret()
        super().__init__(store or MemoryStore(), MemoryDedup(), settings, AgentRegistry(agents))
        self.lease: MemoryLease = MemoryLease()
        self.log: list[Event] = []
        self.woken: list[str] = []
        self.outbox: list[OutboxRow] = []
        self.deps = SliceDeps(
            store=self.store,
            lease=self.lease,
            dedup=self.dedup,
            dispatcher=self,
            events=self,
            agents=self.agents or AgentRegistry(),
            settings=settings,
            sleep=lambda _s: None,
        )

    # Dispatcher and EventSink
    def wake(self, thread_id: str, priority: int) -> bool:
        self.woken.append(thread_id)
        return True

    def dispatch(self, row: OutboxRow) -> None:
        self.outbox.append(row)

    def publish(self, event: Event) -> None:
        self.log.append(event)

    def events(self, thread_id: str) -> list[Event]:
        return [e for e in self.log if e.thread_id == thread_id]

    # driving
    def step(self, thread_id: str) -> SliceOutcome:
        return run_slice(thread_id, self.deps)

    def run_tools(self) -> int:
        rows, self.outbox = self.outbox, []
        for row in rows:
            execute_outbox(
                row,
                self.store,
                self.deps.agents,
                self,
                self.callback_url,
                self.deps.crash,
                settings=self.deps.settings,
            )
        return len(rows)

    def settle(self, thread_id: str, max_steps: int = 20) -> SliceOutcome:
        """Run slices and tools until the thread has nothing left to do now."""
        outcome = self.step(thread_id)
        for _ in range(max_steps):
            ran = self.run_tools()
            if not ran and not self.store.has_pending_after(
                thread_id, self.store.thread(thread_id).inbox_seen
            ):
                return outcome
            outcome = self.step(thread_id)
        raise AssertionError(f"thread {thread_id} did not settle in {max_steps} steps")

    def drain(self, max_rounds: int = 50) -> None:
        """Run every thread's slices and every tool until nothing is left to do now."""
        for _ in range(max_rounds):
            ran = self.run_tools()
            woken = self.store.threads_to_wake(limit=10_000)
            for thread_id in woken:
                self.step(thread_id)
            if not ran and not woken:
                return
        raise AssertionError(f"work still pending after {max_rounds} rounds")

    def arm(self, *points: str) -> None:
        self.deps = replace(
            self.deps, settings=replace(self.deps.settings, crash_points=frozenset(points))
        )

    def restart(self) -> None:
        """A new process: armed crash points gone, leases of the dead holder expired."""
        self.arm()
        self.lease.expire_all()

    def crash_at(self, point: str, action: Callable[[], object]) -> None:
        self.arm(point)
        try:
            action()
        except CrashPoint:
            pass
        else:
            raise AssertionError(f"crash point {point!r} was not reached")
        self.restart()

    def sweep(self, *, lost: bool = False) -> None:
        """What the sweeper does, at once (no grace period); with ``lost``, as if the
        visibility timeout had passed, so dispatched rows no worker ran are sent again."""
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        for row in self.store.fire_due_timers(now):
            self.wake(row.thread_id, row.priority)
        for outbox in self.store.undispatched(now, lost_before=now if lost else None):
            self.dispatch(outbox)
            self.store.mark_dispatched([outbox.id])


def last_is(kind: type[Item]) -> Callable[[Sequence[Item]], bool]:
    return lambda items: bool(items) and isinstance(items[-1], kind)


def user_or_result(
    on_user: Callable[[Sequence[Item]], Completion],
    on_result: Callable[[Sequence[Item]], Completion],
) -> Callable[[Sequence[Item]], Completion]:
    """A script answering user text one way and anything else (results, events) another."""

    def script(items: Sequence[Item]) -> Completion:
        return on_user(items) if isinstance(items[-1], UserText) else on_result(items)

    return script


def results(items: Sequence[Item]) -> list[ToolResult]:
    return [i for i in items if isinstance(i, ToolResult)]


def poll(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Wait until ``condition()`` holds, looking every 10 ms; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)
