"""``ForkMethods``: what ``BaseClient`` offers on forks, kept out of ``base_client.py``."""

from __future__ import annotations

from typing import Any

from dormant.runtime.forks import OpenCalls, fork_thread
from dormant.stores.base import Store, ThreadInfo

__all__ = ["ForkMethods"]


class ForkMethods:
    """Mixed into ``BaseClient``: forking over its ``store``."""

    store: Store

    def fork(
        self,
        thread_id: str,
        at_seq: int,
        *,
        open_calls: OpenCalls = "cancel",
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """A new root thread whose history is ``thread_id``'s up to item ``at_seq``, by
        reference (one thread row, whatever the source's length); returns its id.

        Afterwards the fork is an ordinary thread: ``send`` continues it. Calls open at
        ``at_seq`` get an error result (``open_calls="cancel"``) or stay pending for a
        ``deliver`` (``"keep"``). Its metadata records the source, the fork point and the
        source agent's version under ``"fork"``. Raises ``UnknownThread`` and
        ``InvalidForkPoint``."""
        return self.fork_info(thread_id, at_seq, open_calls=open_calls, metadata=metadata).id

    def fork_info(
        self,
        thread_id: str,
        at_seq: int,
        *,
        open_calls: OpenCalls = "cancel",
        metadata: dict[str, Any] | None = None,
    ) -> ThreadInfo:
        """``fork``, returning the new thread's record."""
        return fork_thread(self.store, thread_id, at_seq, open_calls=open_calls, metadata=metadata)
