"""The client surface shared by ``LocalSystem`` and ``Client``: launch, send, deliver, read.

``Client`` needs only URLs: it writes the inbox row and sends the slice task by name, so a
Django or Flask process needs none of the agents' tool code. Celery and Redis are reached
only when a ``Client`` is built, through functions of ``dormant.worker`` and
``dormant.stores.redis``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self

from dormant.agents import AgentRegistry
from dormant.errors import (
    CallAnswered,
    ConfigurationError,
    ControlSignal,
    DuplicateMessage,
    MessageRejected,
    PayloadTooLarge,
    ThreadBusy,
)
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
    CallState,
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
from dormant.stores.lineage import full_history
from dormant.tokens import callback_url, parse_callback_url, verify
from dormant.tools.runner import as_text

if TYPE_CHECKING:
    from celery import Celery
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session, scoped_session

    from dormant.stores.redis import RedisEvents

    CallerTransaction = Connection | Session | scoped_session[Any]

__all__ = ["BaseClient", "Client", "OnCommit", "Waker"]

log = logging.getLogger("dormant.client")

Waker = Callable[[str, int], None]
"""Arranges a slice for (thread_id, priority)."""
OnCommit = Callable[[Callable[[], object]], None]
"""Runs a function once the caller's current transaction commits, and never if it rolls
back (Django's ``transaction.on_commit``, or ``dormant.contrib.flask``'s session hook)."""


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def new_thread_id() -> str:
    return f"thr_{uuid.uuid4().hex[:20]}"


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
        """Start a thread of ``agent`` with user ``text``; returns the thread id.

        Retry-safe with a chosen ``thread_id``: launching it again with the same agent and
        text returns the id and creates nothing (the first message is ``launch:<thread_id>``
        unless ``message_id`` says otherwise).
        """
        if self.agents is not None:
            self.agents.get_agent(agent)
        chosen = thread_id is not None
        thread_id = thread_id or new_thread_id()
        self._check_size(thread_id, text)
        message_id = message_id or f"launch:{thread_id}"
        try:
            self.store.create_thread(NewThread(id=thread_id, agent=agent, metadata=metadata or {}))
        except DuplicateMessage:
            existing = self.store.thread(thread_id).agent
            if not chosen or existing != agent:
                raise MessageRejected(
                    f"thread {thread_id!r} exists already, for agent {existing!r}"
                ) from None
        try:
            self._enqueue(thread_id, message_id, UserMessage(text=text), Priority.INTERACTIVE)
        except DuplicateMessage:
            if not chosen:
                raise
            if not self._launched_with(thread_id, message_id, text):
                raise MessageRejected(
                    f"thread {thread_id!r} was already launched (message {message_id!r}) "
                    "with other text"
                ) from None
            self._wake_saved(thread_id, Priority.INTERACTIVE)  # the first wake may have failed
        return thread_id

    def _launched_with(self, thread_id: str, message_id: str, text: str) -> bool:
        """Whether ``message_id`` of the thread is user ``text`` (a retried launch)."""
        return any(
            row.message_id == message_id
            and isinstance(row.message, UserMessage)
            and row.message.text == text
            for row in self.store.inbox(thread_id)
        )

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
        message_id = message_id or new_message_id()
        self._refuse_second_result(thread_id, call_id, message_id)
        message = ToolResultMessage(call_id=call_id, content=content, is_error=is_error)
        return self._enqueue(thread_id, message_id, message, Priority.BACKGROUND)

    def _refuse_second_result(self, thread_id: str, call_id: str, message_id: str) -> None:
        """``CallAnswered`` for a new result on an answered call, which would change
        nothing; ``DuplicateMessage`` if it is the answer itself arriving again."""
        call = self.store.call(thread_id, call_id)
        if call.state is not CallState.ANSWERED or call.subscription:
            return  # pending, a subscription (events), or interrupted (a late result)
        if self.dedup.seen(thread_id, message_id) or any(
            row.message_id == message_id for row in self.store.inbox(thread_id)
        ):
            raise DuplicateMessage(thread_id, message_id)
        raise CallAnswered(thread_id, call_id, message_id)

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
            try:
                self.deliver(
                    thread_id, call_id, content, message_id=f"result:{call_id}", is_error=is_error
                )
            except CallAnswered as refused:
                # Answered meanwhile by someone else (an operator's deliver): theirs stands.
                log.warning("tool result dropped: %s", refused)

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
        on_commit: OnCommit | None = None,
    ) -> None:
        super().__init__(store, dedup, settings, agents)
        self._waker = waker
        self._events = events
        self._on_close = on_close
        self.on_commit = on_commit
        """Set by ``dormant.contrib``: what ``launch_on_commit`` and ``send_on_commit`` use."""

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        agents: AgentRegistry | None = None,
        **overrides: Any,
    ) -> Self:
        """A client configured by ``DORMANT_*`` variables (``overrides`` win).

        ``agents`` is optional: with it, ``launch`` checks agent names and ``send`` honours
        ``steering="reject"`` at once; without it, the process needs none of the agents' code.
        """
        return cls.from_settings(Settings.from_env(env, **overrides), agents=agents)

    @classmethod
    def from_celery(
        cls,
        celery_app: Celery,
        settings: Settings | None = None,
        *,
        agents: AgentRegistry | None = None,
        on_commit: OnCommit | None = None,
    ) -> Self:
        """A client that sends its wakes through the host's own Celery app (Django's
        ``proj.celery.app``): its broker URL, transport options and connection pool are
        used as they are, so the broker is configured once, in the host's settings."""
        return cls.from_settings(
            settings or Settings.from_env(),
            agents=agents,
            celery_app=celery_app,
            on_commit=on_commit,
        )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        agents: AgentRegistry | None = None,
        celery_app: Celery | None = None,
        on_commit: OnCommit | None = None,
    ) -> Self:
        from dormant.labels import LabelledSQLStore, TaskLabels
        from dormant.stores.redis import (
            RedisDedup,
            RedisEvents,
            RedisLease,
            RedisWakeMarks,
            redis_client,
            wake_mark_ttl_s,
        )
        from dormant.worker import CeleryDispatcher, client_dispatcher

        redis = redis_client(settings)
        # The agents of threads this client launched or read name their slices in Flower.
        store = LabelledSQLStore(
            settings.database_url, TaskLabels(), table_prefix=settings.table_prefix
        )
        marks = RedisWakeMarks(redis, settings.key_prefix, wake_mark_ttl_s(settings))
        if celery_app is None:
            dispatcher = client_dispatcher(settings, marks, store.labels)
        else:
            dispatcher = CeleryDispatcher(celery_app, marks, labels=store.labels)

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
            on_commit=on_commit,
        )
        if agents is not None:
            client.lease = RedisLease(redis, settings.key_prefix)
        return client

    def wake(self, thread_id: str, priority: int) -> None:
        self._waker(thread_id, priority)

    def events(self, thread_id: str) -> list[Event]:
        """The thread's recent events (not chunks), oldest first; lost if Redis is flushed."""
        return self._events.recent(thread_id)

    # the caller's transaction -----------------------------------------------------------

    def launch(
        self,
        agent: str,
        text: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        message_id: str | None = None,
        connection: CallerTransaction | None = None,
    ) -> str:
        """Start a thread; with ``connection`` (a SQLAlchemy ``Connection`` or ``Session``
        on dormant's database) its rows are written in the caller's transaction and the
        thread is woken after that transaction commits. See ``in_transaction``."""
        options: dict[str, Any] = {
            "thread_id": thread_id,
            "metadata": metadata,
            "message_id": message_id,
        }
        if connection is not None:
            return self.in_transaction(connection).launch(agent, text, **options)
        return super().launch(agent, text, **options)

    def send(
        self,
        thread_id: str,
        text: str,
        *,
        connection: CallerTransaction | None = None,
        message_id: str | None = None,
    ) -> str:
        """Queue user text; with ``connection``, in the caller's transaction (see ``launch``)."""
        if connection is not None:
            return self.in_transaction(connection).send(thread_id, text, message_id=message_id)
        return super().send(thread_id, text, message_id=message_id)

    def in_transaction(self, connection: CallerTransaction) -> Client:
        """This client writing on the caller's connection: its thread and inbox rows commit
        or roll back with the caller's own rows, and its wakes are sent only after a commit.

        With a ``Session`` the wake follows the commit; with a bare ``Connection`` it is sent
        as the ``COMMIT`` is issued (SQLAlchemy has no later hook), so a slice may start a
        moment before the rows are visible: it then finds nothing to do, and the sweeper
        re-wakes the thread within ``sweep_interval_s``. A lost wake is covered the same way.
        """
        from dormant.contrib.sqlalchemy import bind

        store, after_commit = bind(self.store, connection)
        return Client(
            store,
            self.dedup,
            self.settings,
            waker=lambda thread_id, priority: after_commit(
                lambda: self._waker(thread_id, priority)
            ),
            events=self._events,
            agents=self.agents,
        )

    def launch_on_commit(
        self,
        agent: str,
        text: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Launch once the caller's transaction commits; nothing if it rolls back.

        Returns the thread id at once (chosen now), so the caller can store it in the same
        transaction. Needs ``on_commit`` (set by ``dormant.contrib.django`` and
        ``dormant.contrib.flask``). Like Celery's ``delay_on_commit``, a process that dies
        between the commit and the launch loses the launch; ``launch(connection=...)``
        does not, where dormant shares the caller's database.
        """
        on_commit = self._require_on_commit()
        if self.agents is not None:
            self.agents.get_agent(agent)
        thread_id = thread_id or new_thread_id()
        on_commit(
            lambda: self.launch(
                agent, text, thread_id=thread_id, metadata=metadata, message_id=message_id
            )
        )
        return thread_id

    def send_on_commit(self, thread_id: str, text: str, *, message_id: str | None = None) -> str:
        """Queue user text once the caller's transaction commits; returns the message id."""
        on_commit = self._require_on_commit()
        message_id = message_id or new_message_id()
        on_commit(lambda: self.send(thread_id, text, message_id=message_id))
        return message_id

    def _require_on_commit(self) -> OnCommit:
        if self.on_commit is None:
            raise ConfigurationError(
                "this client has no on_commit hook: build it with dormant.contrib.django "
                "or dormant.contrib.flask, or pass Client.from_celery(..., on_commit=...)"
            )
        return self.on_commit

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
