"""A SQLite file's driver connection per thread, kept from one transaction to the next.

Through the pool, a transaction's checkout and return (the pool's queue, its events, the
reset, the fairy's bookkeeping) cost about 80,000 instructions, four times a
one-statement transaction's own: ``valgrind --tool=callgrind`` counted 101,800 against
22,000 a ``SELECT 1`` transaction (docs/benchmarks.md), and a turn on SQLite runs about
six transactions a completion. A SQLite connection holds no server's resources, only a file
handle, so each thread that runs ``direct.py`` transactions keeps its own: taken from the
pool once and detached from it, so the pool's size bounds nothing a thread keeps.

A connection dies with its thread (the next connection opened closes those of threads that
ended) or with the store (``close``). A forked child opens its own: SQLite's connections
must not cross a fork, so a parent's are left untouched, neither used nor closed. In-memory
SQLite shares one connection on purpose (``engine.py``) and PostgreSQL's connections are a
server's: both keep using the pool.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

__all__ = ["KeptConnections"]


@dataclass(frozen=True)
class _Kept:
    thread: weakref.ref[threading.Thread]
    pid: int
    fairy: Any
    """A pool connection detached from its pool (``dbapi_connection`` is None once closed
    or invalidated)."""


class KeptConnections:
    """The connections of one engine's threads."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._local = threading.local()
        self._lock = threading.Lock()
        self._kept: list[_Kept] = []
        self._forked_away: list[_Kept] = []
        """A parent's connections, referenced so that a child never closes them."""

    def get(self) -> Any:
        """This thread's connection: opened on first use, after an error invalidated it,
        and in a forked child."""
        kept: _Kept | None = getattr(self._local, "kept", None)
        pid = os.getpid()
        if kept is not None and kept.pid == pid and kept.fairy.dbapi_connection is not None:
            return kept.fairy
        fairy = self._engine.raw_connection()
        fairy.detach()
        kept = _Kept(weakref.ref(threading.current_thread()), pid, fairy)
        self._local.kept = kept
        with self._lock:
            self._keep(kept)
        return fairy

    def close(self) -> None:
        """Close every connection this process keeps (a thread that asks again reopens)."""
        with self._lock:
            kept, self._kept = self._kept, []
        for each in kept:
            if each.pid == os.getpid():
                each.fairy.close()

    def _keep(self, new: _Kept) -> None:
        """Add ``new``; close the connections of threads that ended, set a parent's aside."""
        still: list[_Kept] = []
        for kept in self._kept:
            thread = kept.thread()
            if kept.pid != new.pid:
                self._forked_away.append(kept)
            elif kept.fairy.dbapi_connection is None:  # invalidated by an error: closed
                continue
            elif thread is None or not thread.is_alive():
                kept.fairy.close()
            else:
                still.append(kept)
        self._kept = [*still, new]
