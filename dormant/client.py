"""``Client``: launch, send, deliver and read threads of a Celery deployment from any process.

``Client`` needs only URLs: it writes the inbox row and sends the slice task by name, so a
Django or Flask process needs none of the agents' tool code. Celery and Redis are reached
only when a ``Client`` is built, through functions of ``dormant.worker`` and
``dormant.stores.redis``. It can also write in the caller's own transaction
(``launch(connection=...)``) or after it commits (``launch_on_commit``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Self

from dormant.agents import AgentRegistry
from dormant.base_client import BaseClient, Waker, new_message_id, new_thread_id
from dormant.budget import Budget
from dormant.errors import ConfigurationError
from dormant.messages import Event
from dormant.settings import Settings
from dormant.stores.base import DedupSet, Lease, OutboxRow, Priority, Store

if TYPE_CHECKING:
    from celery import Celery
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session, scoped_session

    from dormant.stores.redis import RedisEvents

    CallerTransaction = Connection | Session | scoped_session[Any]

__all__ = ["BaseClient", "Client", "OnCommit", "Waker", "new_message_id", "new_thread_id"]

log = logging.getLogger("dormant.client")

OnCommit = Callable[[Callable[[], object]], None]
"""Runs a function once the caller's current transaction commits, and never if it rolls
back (Django's ``transaction.on_commit``, or ``dormant.contrib.flask``'s session hook)."""


class Client(BaseClient):
    """Launch, send, deliver and read threads of a Celery deployment.

    ``Client.from_env()`` reads ``DORMANT_DATABASE_URL``, ``DORMANT_BROKER_URL`` and
    ``DORMANT_REDIS_URL``; the database must already be migrated (``dormant db upgrade``):
    on an older schema the client refuses to be built (``SchemaMismatch``).
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
        dispatcher: Callable[[OutboxRow], None] | None = None,
        lease: Lease | None = None,
    ) -> None:
        super().__init__(store, dedup, settings, agents)
        self._waker = waker
        self._dispatcher = dispatcher
        """Sends outbox rows (a close's "cancel" rows); without it, the sweeper does."""
        self.lease = lease
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
        from dormant.celery.dispatch import CeleryDispatcher, client_dispatcher
        from dormant.celery.labels import LabelledSQLStore, TaskLabels
        from dormant.stores.redis import (
            RedisDedup,
            RedisEvents,
            RedisLease,
            RedisWakeMarks,
            redis_client,
            wake_mark_ttl_s,
        )
        from dormant.stores.redis_limiter import RedisLimiter
        from dormant.stores.redis_live import RedisLive

        redis = redis_client(settings)
        # The agents of threads this client launched or read name their slices in Flower.
        store = LabelledSQLStore(
            settings.database_url,
            TaskLabels(),
            table_prefix=settings.table_prefix,
            history_cache_bytes=settings.history_cache_bytes,
        )
        try:  # before Redis and the broker: nothing else to close if it refuses
            ahead = store.check_schema(at_start=True)
        except Exception:
            store.close()
            raise
        if ahead is not None:  # as during a rolling upgrade: said, not refused
            log.warning("%s", ahead)
        marks = RedisWakeMarks(redis, settings.key_prefix, wake_mark_ttl_s(settings))
        if celery_app is None:
            dispatcher = client_dispatcher(settings, marks, store.labels)
        else:
            dispatcher = CeleryDispatcher(celery_app, marks, labels=store.labels)

        live = RedisLive(redis, settings.key_prefix, url=settings.redis_url)

        def close() -> None:
            store.close()
            live.close()
            redis.close()
            if celery_app is None:  # the dispatcher's own app; never the host's
                dispatcher.close_broker()

        client = cls(
            store,
            RedisDedup(redis, settings.key_prefix, settings.dedup_ttl_s),
            settings,
            waker=dispatcher.wake,
            events=RedisEvents(redis, settings.key_prefix, ttl_s=settings.dedup_ttl_s),
            agents=agents,
            on_close=close,
            on_commit=on_commit,
            dispatcher=dispatcher.dispatch,
            lease=RedisLease(redis, settings.key_prefix),
        )
        client.live = live
        # background launches join their line's queue for model capacity without a slice
        client.parking = RedisLimiter(redis, settings.key_prefix)
        return client

    def wake(self, thread_id: str, priority: int) -> bool:
        return self._waker(thread_id, priority)

    def events(self, thread_id: str) -> list[Event]:
        """The thread's recent events (not chunks), oldest first; lost if Redis is flushed."""
        return self._events.recent(thread_id)

    def dispatch(self, row: OutboxRow) -> None:
        if self._dispatcher is not None:
            self._dispatcher(row)

    def publish(self, event: Event) -> None:
        self._events.publish(event)

    # the caller's transaction -----------------------------------------------------------

    def launch(
        self,
        agent: str,
        text: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        message_id: str | None = None,
        priority: Priority | str = Priority.INTERACTIVE,
        connection: CallerTransaction | None = None,
        budget: Budget | None = None,
    ) -> str:
        """Start a thread; with ``connection`` (a SQLAlchemy ``Connection`` or ``Session``
        on dormant's database) its rows are written in the caller's transaction and the
        thread is woken after that transaction commits. See ``in_transaction``."""
        options: dict[str, Any] = {
            "thread_id": thread_id,
            "metadata": metadata,
            "message_id": message_id,
            "budget": budget,
            "priority": priority,
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

        def wake_after_commit(thread_id: str, priority: int) -> bool:
            after_commit(lambda: self._waker(thread_id, priority))
            return True  # sent when the caller commits

        client = Client(
            store,
            self.dedup,
            self.settings,
            waker=wake_after_commit,
            events=self._events,
            agents=self.agents,
        )
        client.parking = self.parking
        return client

    def launch_on_commit(
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
        """Launch once the caller's transaction commits; nothing if it rolls back.

        Returns the thread id at once (chosen now), so the caller can store it in the same
        transaction. Needs ``on_commit`` (set by ``dormant.contrib.django`` and
        ``dormant.contrib.flask``). Like Celery's ``delay_on_commit``, a process that dies
        between the commit and the launch loses the launch; ``launch(connection=...)``
        does not, where dormant shares the caller's database.
        """
        on_commit = self._require_on_commit()
        priority = Priority.of(priority)  # refused now, not after the caller's commit
        if self.agents is not None:
            self.agents.get_agent(agent)
        thread_id = thread_id or new_thread_id()
        on_commit(
            lambda: self.launch(
                agent,
                text,
                thread_id=thread_id,
                metadata=metadata,
                message_id=message_id,
                budget=budget,
                priority=priority,
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
