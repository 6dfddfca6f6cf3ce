"""The client surface shared by ``LocalSystem`` and ``Client``: launch, send, deliver, read.

``Client`` needs only URLs: it writes the inbox row and sends the slice task by name, so a
Django or Flask process needs none of the agents' tool code. Celery and Redis are reached
only when a ``Client`` is built, through functions of ``dormant.worker`` and
``dormant.stores.redis``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from dormant.agents import AgentRegistry
from dormant.errors import DuplicateMessage, PayloadTooLarge, ThreadBusy
from dormant.history import pending
from dormant.messages import (
    Event,
    EventMessage,
    Inbound,
    Item,
    ToolResultMessage,
    UserMessage,
)
from dormant.settings import Settings
from dormant.stores.base import (
    DedupSet,
    Lease,
    NewThread,
    NewTimer,
    Priority,
    Store,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
)
from dormant.tokens import callback_url, parse_callback_url, verify
from dormant.tools.runner import as_text

if TYPE_CHECKING:
    from dormant.stores.redis import RedisEvents

__all__ = ["BaseClient", "Client", "Waker"]

Waker = Callable[[str, int], None]
"""Arranges a slice for (thread_id, priority)."""


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


class BaseClient(ABC):
    """Everything a caller does to threads, over a store, a dedup set and a waker."""

    def __init__(
        self,
        store: Store,
        dedup: DedupSet,
        settings: Settings,
        agents: AgentRegistry | None = None,
    ) -> None:
        self.store = store
        self.dedup = dedup
        self.settings = settings
        self.agents = agents
        self.lease: Lease | None = None
        """Set by runtimes that can see leases: enables ``steering="reject"`` at send time."""

    @abstractmethod
    def wake(self, thread_id: str, priority: int) -> None:
        """Arrange for a slice of ``thread_id`` to run."""

    @abstractmethod
    def events(self, thread_id: str) -> list[Event]:
        """Recent live events of ``thread_id``."""

    # writing ----------------------------------------------------------------------------

    def launch(
        self,
        agent: str,
        text: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Start a thread of ``agent`` with user ``text``; returns the thread id."""
        if self.agents is not None:
            self.agents.get_agent(agent)
        self._check_size(thread_id or "(new)", text)
        thread = self.store.create_thread(
            NewThread(
                id=thread_id or f"thr_{uuid.uuid4().hex[:20]}", agent=agent, metadata=metadata or {}
            )
        )
        self._enqueue(thread.id, message_id, UserMessage(text=text), Priority.INTERACTIVE)
        return thread.id

    def send(self, thread_id: str, text: str, *, message_id: str | None = None) -> str:
        """Queue user text for a thread; returns the message id.

        Raises ``ThreadBusy`` when the thread's agent uses ``steering="reject"`` and a
        slice of the thread is running (checked where the agents and leases are known).
        """
        self._check_size(thread_id, text)
        self._refuse_if_busy(thread_id)
        return self._enqueue(thread_id, message_id, UserMessage(text=text), Priority.INTERACTIVE)

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
        self._check_size(thread_id, content)
        message = ToolResultMessage(call_id=call_id, content=content, is_error=is_error)
        return self._enqueue(thread_id, message_id, message, Priority.BACKGROUND)

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
        self._check_size(thread_id, text)
        message = EventMessage(call_id=call_id, content=text, associative=associative, final=final)
        return self._enqueue(thread_id, message_id, message, Priority.BACKGROUND)

    def retry(self, thread_id: str) -> ThreadInfo:
        """Re-drive a stalled thread: its queued messages are applied again."""
        snap = self.store.load(thread_id)
        thread = snap.thread
        if thread.status is ThreadStatus.STALLED:
            status = ThreadStatus.WAITING if pending(snap.calls) else ThreadStatus.IDLE
            thread = self.store.set_status(thread_id, status)
        self.wake(thread_id, Priority.INTERACTIVE)
        return thread

    # reading ----------------------------------------------------------------------------

    def history(self, thread_id: str) -> list[Item]:
        return [stored.item for stored in self.store.history(thread_id)]

    def stored_history(self, thread_id: str) -> list[StoredItem]:
        return self.store.history(thread_id)

    def thread(self, thread_id: str) -> ThreadInfo:
        return self.store.thread(thread_id)

    def threads(self, status: ThreadStatus | None = None, limit: int = 100) -> list[ThreadInfo]:
        return self.store.threads(status, limit)

    def callback_url(self, thread_id: str, call_id: str) -> str:
        expires = int(time.time() + self.settings.token_ttl_s)
        return callback_url(
            self.settings.callback_base_url, self.settings.secret_keys, thread_id, call_id, expires
        )

    # the ToolSink protocol (what running tools send) -------------------------------------

    def tool_result(
        self, thread_id: str, call_id: str, content: str, *, is_error: bool = False
    ) -> None:
        # A re-dispatched tool answering twice: the first answer stands.
        with contextlib.suppress(DuplicateMessage):
            self.deliver(
                thread_id, call_id, content, message_id=f"result:{call_id}", is_error=is_error
            )

    def tool_event(
        self,
        thread_id: str,
        call_id: str,
        content: str,
        *,
        associative: bool,
        final: bool,
        message_id: str | None,
    ) -> None:
        with contextlib.suppress(DuplicateMessage):
            self.send_event(
                thread_id,
                call_id,
                content,
                associative=associative,
                final=final,
                message_id=message_id,
            )

    def tool_schedule(self, thread_id: str, call_id: str, content: str, at: datetime) -> None:
        message = EventMessage(call_id=call_id, content=content)
        self.store.add_timer(
            thread_id, NewTimer(call_id, at, f"schedule:{uuid.uuid4().hex}", message)
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

    def _check_size(self, thread_id: str, text: str) -> None:
        size = len(text.encode())
        if size > self.settings.max_message_bytes:
            raise PayloadTooLarge(
                f"message for thread {thread_id!r} is {size} bytes; "
                f"the limit is {self.settings.max_message_bytes}"
            )

    def _enqueue(
        self, thread_id: str, message_id: str | None, message: Inbound, priority: int
    ) -> str:
        message_id = message_id or new_message_id()
        if self.dedup.seen(thread_id, message_id):
            raise DuplicateMessage(thread_id, message_id)
        self.store.enqueue(thread_id, message_id, message, priority)
        self.wake(thread_id, priority)
        return message_id


class Client(BaseClient):
    """Launch, send, deliver and read threads of a Celery deployment.

    ``Client.from_env()`` reads ``DORMANT_DATABASE_URL``, ``DORMANT_BROKER_URL`` and
    ``DORMANT_REDIS_URL``; the database must already be migrated (``dormant db upgrade``).
    """

    def __init__(
        self,
        store: Store,
        dedup: DedupSet,
        settings: Settings,
        *,
        waker: Waker,
        events: RedisEvents,
        agents: AgentRegistry | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(store, dedup, settings, agents)
        self._waker = waker
        self._events = events
        self._on_close = on_close

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        agents: AgentRegistry | None = None,
        **overrides: Any,
    ) -> Client:
        """A client configured by ``DORMANT_*`` variables (``overrides`` win).

        ``agents`` is optional: with it, ``launch`` checks agent names and ``send`` honours
        ``steering="reject"`` at once; without it, the process needs none of the agents' code.
        """
        return cls.from_settings(Settings.from_env(env, **overrides), agents=agents)

    @classmethod
    def from_settings(cls, settings: Settings, *, agents: AgentRegistry | None = None) -> Client:
        from dormant.labels import LabelledSQLStore, TaskLabels
        from dormant.stores.redis import (
            RedisDedup,
            RedisEvents,
            RedisLease,
            RedisWakeMarks,
            redis_client,
            wake_mark_ttl_s,
        )
        from dormant.worker import client_dispatcher

        redis = redis_client(settings)
        # The agents of threads this client launched or read name their slices in Flower.
        store = LabelledSQLStore(settings.database_url, TaskLabels())
        marks = RedisWakeMarks(redis, settings.key_prefix, wake_mark_ttl_s(settings))
        dispatcher = client_dispatcher(settings, marks, store.labels)

        def close() -> None:
            store.close()
            redis.close()

        client = cls(
            store,
            RedisDedup(redis, settings.key_prefix, settings.dedup_ttl_s),
            settings,
            waker=dispatcher.wake,
            events=RedisEvents(redis, settings.key_prefix, ttl_s=settings.dedup_ttl_s),
            agents=agents,
            on_close=close,
        )
        if agents is not None:
            client.lease = RedisLease(redis, settings.key_prefix)
        return client

    def wake(self, thread_id: str, priority: int) -> None:
        self._waker(thread_id, priority)

    def events(self, thread_id: str) -> list[Event]:
        """The thread's recent events (not chunks), oldest first; lost if Redis is flushed."""
        return self._events.recent(thread_id)

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
