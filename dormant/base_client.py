"""``BaseClient``: what every caller does to threads, shared by ``LocalSystem`` and ``Client``.

Launch, send, deliver, read, and what running tools send back: all over a store, a dedup
set and a waker, so the embedded runtime and a Celery deployment's clients keep one set of
rules (sizes, steering, second results, retry-safe launches).
"""

from __future__ import annotations

import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime
from typing import Any

from dormant.agents import AgentRegistry
from dormant.approvals import ApprovalMethods
from dormant.budget import Budget, with_budget
from dormant.errors import (
    ControlSignal,
    DuplicateMessage,
    MessageRejected,
    PayloadTooLarge,
    ThreadBusy,
)
from dormant.http.tokens import callback_url, parse_callback_url, stream_url, verify
from dormant.messages import (
    Event,
    EventMessage,
    Inbound,
    Item,
    ToolResultMessage,
    UserMessage,
    UserText,
)
from dormant.ops.retry import redrive
from dormant.replay.client import ForkMethods
from dormant.runtime.admission import park
from dormant.runtime.budgets import raise_limits
from dormant.runtime.close import Closing, close_thread, log_incomplete
from dormant.runtime.limiter import Limiter
from dormant.runtime.stream import StreamMethods
from dormant.settings import Settings
from dormant.stores.base import (
    DedupSet,
    Lease,
    NewThread,
    OutboxRow,
    Priority,
    Store,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
    VersionSpan,
)
from dormant.stores.lineage import full_history
from dormant.streams import LiveLog
from dormant.tools.runner import as_text
from dormant.tools.sink import ToolSinkMethods
from dormant.tracing import capture
from dormant.tracing import provider as tracer_provider

__all__ = ["BaseClient", "Waker", "new_message_id", "new_thread_id"]

log = logging.getLogger("dormant.client")

Waker = Callable[[str, int], bool]
"""Arranges a slice for (thread_id, priority); False if one at least as urgent is queued."""


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def new_thread_id() -> str:
    return f"thr_{uuid.uuid4().hex[:20]}"


class BaseClient(ApprovalMethods, ForkMethods, StreamMethods, ToolSinkMethods, ABC):
    """Everything a caller does to threads, over a store, a dedup set and a waker."""

    def __init__(
        self,
        store: Store,
        dedup: DedupSet,
        settings: Settings,
        agents: AgentRegistry | None = None,
    ) -> None:
        # A schema older than this dormant refuses the client now, not at its first write
        # ("no such column"); a newer one is said, as during a rolling upgrade.
        ahead = store.check_schema(at_start=True)
        if ahead is not None:
            log.warning("%s", ahead)
        self.store = store
        self.dedup = dedup
        self.settings = settings
        self.agents = agents
        self.lease: Lease | None = None
        """Set by runtimes that can see leases: enables ``steering="reject"`` at send time."""
        self.live: LiveLog | None = None
        """The live log of streams (``stream``): Redis's, or ``LocalSystem``'s own."""
        self.parking: Limiter | None = None
        """Set by ``Client``: a background launch whose agent and flow queue for model
        capacity takes its place there and is not woken now (``admission.park``)."""

    @abstractmethod
    def wake(self, thread_id: str, priority: int) -> bool:
        """Arrange for a slice of ``thread_id`` to run; False if one at least as urgent is
        already queued."""

    @abstractmethod
    def events(self, thread_id: str) -> list[Event]:
        """Recent live events of ``thread_id``."""

    @abstractmethod
    def dispatch(self, row: OutboxRow) -> None:
        """Send an outbox row's work (a close's "cancel" hooks). One that sends nothing
        leaves it to the sweeper, which sends rows older than ``outbox_grace_s``."""

    @abstractmethod
    def publish(self, event: Event) -> None:
        """Publish a live event (a close's status change)."""

    # writing ----------------------------------------------------------------------------

    def launch(
        self,
        agent: str,
        text: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        message_id: str | None = None,
        budget: Budget | None = None,
        priority: Priority | str = Priority.INTERACTIVE,
    ) -> str:
        """Start a thread of ``agent`` with user ``text``; returns the thread id.

        ``budget`` replaces the agent's for this thread and everything it spawns (kept in
        its metadata under ``"budget"``).

        Retry-safe with a chosen ``thread_id``: launching it again with the same agent and
        text returns the id and creates nothing (the first message is ``launch:<thread_id>``
        unless ``message_id`` says otherwise).

        ``priority`` is the first slice's: "interactive" (the default: a person waits on
        it) or "background" (a webhook, a schedule, a batch: it queues behind user text).
        """
        priority = Priority.of(priority)
        if self.agents is not None:
            self.agents.get_agent(agent)
        chosen = thread_id is not None
        thread_id = thread_id or new_thread_id()
        self._check_size(thread_id, text, "user text")
        message_id = message_id or f"launch:{thread_id}"
        first = UserMessage(text=text)
        parking = self.parking if priority < Priority.INTERACTIVE else None
        parked_until = None if parking is None else park(parking, agent, metadata, thread_id)
        new = NewThread(
            id=thread_id,
            agent=agent,
            metadata=with_budget(metadata, budget),
            messages=[(message_id, first, priority)],
            trace=capture(),  # a launch inside a traced request: the first slice is its child
            retry_at=parked_until,
        )
        try:
            self.store.create_thread(new)  # one transaction: the thread with its message
        except DuplicateMessage:
            existing = self.store.thread(thread_id).agent
            if not chosen or existing != agent:
                raise MessageRejected(
                    f"thread {thread_id!r} exists already, for agent {existing!r}"
                ) from None
            self._relaunch(thread_id, message_id, text, priority)
            return thread_id
        if parked_until is None:  # parked: the slice admitted before it wakes it
            self._wake_saved(thread_id, priority)
        return thread_id

    def _relaunch(self, thread_id: str, message_id: str, text: str, priority: Priority) -> None:
        """A launch of a thread that exists: queue its first message if a store of an older
        version created the thread without it, and wake it (the first wake may have failed)."""
        try:
            self._enqueue(thread_id, message_id, UserMessage(text=text), priority)
        except DuplicateMessage:
            if not self._launched_with(thread_id, message_id, text):
                raise MessageRejected(
                    f"thread {thread_id!r} was already launched (message {message_id!r}) "
                    "with other text"
                ) from None
            self._wake_saved(thread_id, priority)

    def _launched_with(self, thread_id: str, message_id: str, text: str) -> bool:
        """Whether ``message_id`` of the thread is user ``text`` (a retried launch): its
        inbox row, or, once retention pruned that, the history item it became."""
        for row in self.store.inbox(thread_id):
            if row.message_id == message_id:
                return isinstance(row.message, UserMessage) and row.message.text == text
        return any(
            stored.message_id == message_id
            and isinstance(stored.item, UserText)
            and stored.item.text == text
            for stored in self.store.own_items(thread_id)
        )

    def send(self, thread_id: str, text: str, *, message_id: str | None = None) -> str:
        """Queue user text for a thread; returns the message id.

        Raises ``ThreadBusy`` when the thread's agent uses ``steering="reject"`` and a
        slice of the thread is running (checked where the agents and leases are known).
        """
        self._check_size(thread_id, text, "user text")
        self._refuse_if_busy(thread_id)
        message = UserMessage(text=text)
        return self._enqueue(thread_id, message_id, message, Priority.INTERACTIVE, limited=True)

    def deliver(
        self,
        thread_id: str,
        call_id: str,
        result: Any,
        *,
        message_id: str | None = None,
        token: str | None = None,
        is_error: bool = False,
    ) -> str:
        """Deliver a result (or, on an active subscription, an event) for ``call_id``.

        With ``token`` the call is a callback and the token must verify; without it the
        caller is trusted (in-process code). Returns the message id.
        """
        if token is not None:
            self.verify_token(thread_id, call_id, token)
        content = as_text(result)
        self._check_size(thread_id, content, f"the result of call {call_id!r}")
        message = ToolResultMessage(call_id=call_id, content=content, is_error=is_error)
        # Sent from outside any span (a deferred tool's callback), the result goes on in the
        # trace of the slice that made the call.
        traced = tracer_provider(self.settings) is not None
        trace = capture() or (self.store.call_trace(thread_id, call_id) if traced else "")
        # A new result on an answered call (not a subscription) would change nothing: the
        # store refuses it (``CallAnswered``) in the transaction that would queue it.
        return self._enqueue(
            thread_id, message_id, message, Priority.BACKGROUND, answered_ok=False, trace=trace
        )

    def verify_token(self, thread_id: str, call_id: str, token: str) -> None:
        """Raise ``InvalidToken`` unless ``token`` is a live capability for this call."""
        verify(self.settings.secret_keys, token, thread_id, call_id, time.time())

    def deliver_callback(self, url: str, result: Any, *, message_id: str | None = None) -> str:
        """Deliver through a callback URL a tool was given (token checked)."""
        thread_id, call_id, token = parse_callback_url(url)
        return self.deliver(thread_id, call_id, result, message_id=message_id, token=token)

    def send_event(
        self,
        thread_id: str,
        call_id: str,
        content: Any,
        *,
        associative: bool = False,
        final: bool = False,
        message_id: str | None = None,
    ) -> str:
        """Send an event on a subscription call."""
        text = as_text(content)
        self._check_size(thread_id, text, f"the event on call {call_id!r}")
        message = EventMessage(call_id=call_id, content=text, associative=associative, final=final)
        return self._enqueue(thread_id, message_id, message, Priority.BACKGROUND, limited=True)

    def retry(self, thread_id: str, message_id: str | None = None) -> ThreadInfo:
        """Re-drive a thread: un-stall it, and put its quarantined messages (or only
        ``message_id``) back in its inbox; they are applied by its next slice, after any
        input it processed meanwhile. ``UnknownMessage`` if ``message_id`` is not
        quarantined there."""
        thread = redrive(self.store, thread_id, message_id).thread
        self.wake(thread_id, Priority.INTERACTIVE)
        return thread

    def raise_budget(
        self,
        thread_id: str,
        *,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        max_completions_per_message: int | None = None,
    ) -> ThreadInfo:
        """Set new limits for the budget of ``thread_id``'s tree (those not given stay) and
        resume the threads of the tree it stopped, as ``retry`` does; the thread's record."""
        limits = {
            "max_tokens": max_tokens,
            "max_cost": max_cost,
            "max_completions_per_message": max_completions_per_message,
        }
        for stopped in raise_limits(self.store, thread_id, limits):
            self.retry(stopped)
        return self.store.thread(thread_id)

    def close_thread(self, thread_id: str, *, reason: str = "closed by request") -> ThreadInfo:
        """Close a thread (a root or a child) and its descendants; its record after.

        Every pending call gets an error result, its subscriptions and timers are
        cancelled, its queued messages are rejected with ``reason`` and later ones are
        refused (``ThreadClosed``); a child's parent is told. A slice running meanwhile
        stops at its next lease renewal and writes nothing. ``reason`` stays on the
        thread's record (``closed_reason``). Closing a closed thread returns it unchanged.
        Raises ``UnknownThread``.

        Once stored, the close is done and returned even if Redis or the broker is down:
        revoking the lease, sending the cancel hooks and publishing the events are best
        effort (``close_incomplete``); the version guard, the lease's expiry and the
        sweeper do their part later.
        """
        closing = Closing(
            self.store,
            dispatcher=self,
            lease=self.lease,
            events=self,
            incomplete=self.close_incomplete,
        )
        return close_thread(thread_id, reason, closing)

    def close_incomplete(self, thread_id: str, missed: str, error: Exception) -> None:
        """Called when a part of a stored close failed (Redis or the broker is down);
        logs a warning. Override it to report it elsewhere (the ``dormant`` command prints
        one line)."""
        log_incomplete(thread_id, missed, error)

    # reading ----------------------------------------------------------------------------

    def history(self, thread_id: str, *, full: bool = False) -> list[Item]:
        """The thread's history as its model sees it: after a compaction, the latest
        summary and the items after it (a child also sees its parent's, up to its fork).

        ``full=True`` gives the whole transcript instead: every item ever stored, in
        order, including those a summary replaced, each summary where it was made.
        """
        return [stored.item for stored in self.stored_history(thread_id, full=full)]

    def stored_history(self, thread_id: str, *, full: bool = False) -> list[StoredItem]:
        """``history`` with each item's position (``seq``) and message id."""
        if full:
            return full_history(self.store, self.store.thread(thread_id))
        return self.store.history(thread_id)

    def thread(self, thread_id: str) -> ThreadInfo:
        return self.store.thread(thread_id)

    def thread_versions(self, thread_id: str) -> list[VersionSpan]:
        """Which version of its agent ran the thread's slices, oldest first: one span until
        a deploy meets the thread (docs/upgrades.md)."""
        return self.store.version_spans(thread_id)

    def threads(
        self,
        status: ThreadStatus | None = None,
        limit: int = 100,
        *,
        agent: str | None = None,
        before: tuple[datetime, str] | None = None,
    ) -> list[ThreadInfo]:
        """Threads newest first; ``before`` pages on (``Store.threads``)."""
        return self.store.threads(status, limit, agent=agent, before=before)

    def stream_url(self, thread_id: str, *, ttl_s: float = 3600.0) -> str:
        """The SSE URL of the thread's stream in ``dormant serve``, with a read token that
        expires after ``ttl_s`` (signed like callback URLs, with keys of its own)."""
        expires = int(time.time() + ttl_s)
        return stream_url(
            self.settings.callback_base_url, self.settings.secret_keys, thread_id, expires
        )

    def callback_url(self, thread_id: str, call_id: str) -> str:
        expires = int(time.time() + self.settings.token_ttl_s)
        return callback_url(
            self.settings.callback_base_url, self.settings.secret_keys, thread_id, call_id, expires
        )

    # internals --------------------------------------------------------------------------

    def _refuse_if_busy(self, thread_id: str) -> None:
        if self.agents is None or self.lease is None:
            return
        if not any(a.steering == "reject" for a in self.agents.values()):
            return  # the common case: no thread read on every send
        agent = self.agents.get(self.store.thread(thread_id).agent)
        if agent is not None and agent.steering == "reject" and self.lease.held(thread_id):
            raise ThreadBusy(thread_id)

    def _check_size(self, thread_id: str, text: str, what: str) -> None:
        """Refuse ``text`` past ``max_message_bytes``; the reason names ``what`` it is, its
        size and the limit (a tool's refused result becomes this reason, for its model)."""
        size = len(text.encode())
        if size > self.settings.max_message_bytes:
            raise PayloadTooLarge(
                f"{what} for thread {thread_id!r} is {size} bytes; "
                f"the limit is {self.settings.max_message_bytes} (max_message_bytes)"
            )

    def _enqueue(
        self,
        thread_id: str,
        message_id: str | None,
        message: Inbound,
        priority: int,
        *,
        limited: bool = False,
        answered_ok: bool = True,
        trace: str | None = None,
    ) -> str:
        """Store and wake; ``limited`` input (user text, events) is refused with
        ``InboxFull`` past ``max_inbox_depth``. Tool results never are: a call must get
        its result, and the thread is what drains its inbox. ``trace``: the context kept
        with the row, else the sender's current span."""
        # Only a caller's own id can have been seen: a fresh one skips the fast path (a
        # Redis round trip on every deliver), and SQL's unique key stays the guarantee.
        if not message_id:
            message_id = new_message_id()
        elif self.dedup.seen(thread_id, message_id):
            raise DuplicateMessage(thread_id, message_id)
        depth = self.settings.max_inbox_depth
        max_open = depth if limited and depth > 0 else None
        self.store.enqueue(
            thread_id,
            message_id,
            message,
            priority,
            max_open=max_open,
            answered_ok=answered_ok,
            trace=capture() if trace is None else trace,  # the sender's span goes with it
        )
        self._wake_saved(thread_id, priority)
        return message_id

    def _wake_saved(self, thread_id: str, priority: int) -> None:
        """Wake a thread whose message is already committed. A failed wake (the broker is
        down) must not fail the call: the message is stored and the sweeper wakes the
        thread, whereas an exception would invite the caller to retry (a second thread)."""
        try:
            self.wake(thread_id, priority)
        except ControlSignal:
            raise
        except Exception as error:
            self.wake_failed(thread_id, error)

    def wake_failed(self, thread_id: str, error: Exception) -> None:
        """Called when the wake after a stored message fails; logs a warning. Override it to
        report the failure elsewhere (the ``dormant`` command prints one line)."""
        log.warning(
            "thread %s: the message is saved but waking the thread failed (%s: %s); "
            "the sweeper will wake it",
            thread_id,
            type(error).__name__,
            error,
        )
