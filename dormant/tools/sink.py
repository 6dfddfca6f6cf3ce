"""``ToolSinkMethods``: how ``BaseClient`` takes what running tools send (the ``ToolSink``
protocol of ``tools/runner.py``), kept out of ``base_client.py``."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from datetime import datetime

from dormant.errors import CallAnswered, DuplicateMessage
from dormant.messages import EventMessage
from dormant.runtime.history import SCHEDULED
from dormant.stores.base import NewTimer, Store

__all__ = ["ToolSinkMethods"]

log = logging.getLogger("dormant.client")


class ToolSinkMethods:
    """Mixed into ``BaseClient``: a tool's result, its events and its scheduled messages,
    each delivered once however often a re-dispatched tool sends it."""

    store: Store

    deliver: Callable[..., str]  # ``BaseClient``'s
    send_event: Callable[..., str]  # ``BaseClient``'s

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
            thread_id, NewTimer(call_id, at, f"{SCHEDULED}{uuid.uuid4().hex}", message)
        )
