"""Writing dormant's rows in the caller's SQLAlchemy transaction, waking after its commit.

A view is the simplest way to hire dormant in the middle of a unit of work: the thread and
its first inbox row commit or vanish with the view's own rows. What must wait for the
commit is the wake (a broker message cannot be rolled back), so wakes are held and sent from
a commit hook; on rollback they are dropped.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, event
from sqlalchemy.orm import Session, scoped_session

from dormant.errors import ConfigurationError
from dormant.stores.base import Store
from dormant.stores.sql.store import SQLStore

__all__ = ["bind", "session_on_commit"]

log = logging.getLogger("dormant.contrib")

AfterCommit = Callable[[Callable[[], object]], None]


def bind(
    store: Store, target: Connection | Session | scoped_session[Any]
) -> tuple[SQLStore, AfterCommit]:
    """``store`` writing on ``target``'s connection, and a function that defers work to
    ``target``'s commit (dropped on rollback)."""
    if not isinstance(store, SQLStore):
        raise ConfigurationError(
            f"writing in the caller's transaction needs the SQL store, not {type(store).__name__}"
        )
    session = target() if isinstance(target, scoped_session) else target
    if isinstance(session, Session):
        return store.on_connection(session.connection()), session_on_commit(session)
    return store.on_connection(session), _connection_on_commit(session)


def session_on_commit(session: Session | scoped_session[Any]) -> AfterCommit:
    """Run functions after ``session``'s current transaction commits; never on rollback."""
    if isinstance(session, scoped_session):
        session = session()
    return _deferred(session, "after_commit", ("after_rollback",)).add


def _connection_on_commit(connection: Connection) -> AfterCommit:
    # ConnectionEvents.commit fires as COMMIT is issued: the nearest hook SQLAlchemy has.
    return _deferred(connection, "commit", ("rollback",)).add


_HOOKS: weakref.WeakKeyDictionary[Any, _Deferred] = weakref.WeakKeyDictionary()
"""One pair of listeners per session or connection, for its lifetime: SQLAlchemy cannot
remove a listener while its event is being dispatched."""
_HOOKS_LOCK = threading.Lock()


def _deferred(target: Any, commit: str, rollbacks: tuple[str, ...]) -> _Deferred:
    with _HOOKS_LOCK:
        deferred = _HOOKS.get(target)
        if deferred is None:
            deferred = _HOOKS[target] = _Deferred()
            event.listen(target, commit, deferred.run)
            for name in rollbacks:
                event.listen(target, name, deferred.drop)
        return deferred


class _Deferred:
    """Functions held until the target's next commit, dropped by a rollback before it."""

    def __init__(self) -> None:
        self._pending: list[Callable[[], object]] = []

    def add(self, fn: Callable[[], object]) -> None:
        self._pending.append(fn)

    def run(self, *_: Any) -> None:
        pending, self._pending = self._pending, []
        for fn in pending:
            try:
                fn()
            except Exception:  # the commit stands; a lost wake is the sweeper's to repair
                log.exception("a wake after commit failed; the sweeper will re-wake the thread")

    def drop(self, *_: Any) -> None:
        self._pending = []
