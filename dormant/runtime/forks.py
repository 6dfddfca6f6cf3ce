"""Forks: a new root thread whose history is another thread's up to a seq, by reference.

A fork stores one thread row (``source_id``, ``fork_seq``) and inherits the source's
items the way a child inherits its parent's (``stores/lineage.py``): nothing is copied, so
forking a thread of ten thousand items costs what forking one of ten costs. Afterwards it
is an ordinary thread (send, close, budget, stream) whose own items start at
``fork_seq + 1``. It is a root, not a child: closing, pruning or budgeting the source never
reaches it, and it reports to no parent.

Calls that are open at the fork point (made at or before ``at_seq``, answered after it)
belong to the source: their tools answer the source. ``open_calls="cancel"`` gives each an
error result in the fork; ``"keep"`` leaves them pending in the fork, for a caller to
``deliver``. Finding them reads only the items since the last assistant turn at or before
the fork point (``lineage.tail``): every call made before that turn was answered before
the model ran it, because a completion runs only when no call is pending.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from dormant.errors import ConfigurationError, InvalidForkPoint
from dormant.messages import AssistantTurn, Inbound, ToolCall, ToolResult
from dormant.runtime.children import new_thread_id
from dormant.stores.base import (
    CallRecord,
    CallState,
    NewThread,
    StoredItem,
    ThreadInfo,
    ThreadStatus,
)
from dormant.stores.lineage import full_history, tail
from dormant.stores.rawitem import item_kind

__all__ = ["FORK_KEY", "ForkStore", "OpenCalls", "fork_record", "fork_thread", "open_at"]

OpenCalls = Literal["cancel", "keep"]

FORK_KEY = "fork"
"""The fork's metadata key: its source, fork point, the source agent's version and the
``open_calls`` mode, so a reader of the fork alone knows where it came from."""

_WINDOW = 8
"""Items read back from the fork point at first; a longer stretch without an assistant
turn (a burst of events) reads four times more, until one is found."""


class ForkStore(Protocol):
    """What forking needs of a store."""

    def thread(self, thread_id: str) -> ThreadInfo: ...

    def own_items(self, thread_id: str, upto_seq: int | None = None) -> list[StoredItem]: ...

    def own_items_between(
        self, thread_id: str, after_seq: int, upto_seq: int
    ) -> list[StoredItem]: ...

    def create_thread(self, thread: NewThread) -> ThreadInfo: ...


def fork_thread(
    store: ForkStore,
    thread_id: str,
    at_seq: int,
    *,
    open_calls: OpenCalls = "cancel",
    metadata: dict[str, Any] | None = None,
    fork_id: str | None = None,
    messages: Sequence[tuple[str, Inbound, int]] = (),
    tag: str | None = None,
) -> ThreadInfo:
    """Make a fork of ``thread_id`` at ``at_seq`` and return it; ``InvalidForkPoint``
    if the source's history has no item at that seq, ``UnknownThread`` if no source.

    ``at_seq=0`` inherits nothing (a replay from the first message); ``messages`` are
    queued with the fork, in its creating transaction (a replay's first input); ``tag``
    sums its usage apart (``ThreadInfo.tag``)."""
    if open_calls not in ("cancel", "keep"):
        raise ConfigurationError(f"open_calls {open_calls!r} is not 'cancel' or 'keep'")
    source = store.thread(thread_id)
    new_id = fork_id or new_thread_id()
    open_ = open_at(store, source, at_seq) if at_seq != 0 else []
    items: list[StoredItem] = []
    calls: list[CallRecord] = []
    for i, call in enumerate(open_):
        if open_calls == "keep":
            calls.append(CallRecord(call.call_id, call.name, call.args, at_seq, CallState.PENDING))
            continue
        calls.append(CallRecord(call.call_id, call.name, call.args, at_seq, CallState.ANSWERED))
        content = (
            f"Not answered: thread {new_id} was forked from thread {source.id} at item "
            f"{at_seq}, before this call's result arrived."
        )
        result = ToolResult(call_id=call.call_id, name=call.name, content=content, is_error=True)
        items.append(StoredItem(at_seq + 1 + i, f"fork:{call.call_id}", result))
    waiting = open_calls == "keep" and bool(open_)
    return store.create_thread(
        NewThread(
            id=new_id,
            agent=source.agent,
            source_id=source.id,
            fork_seq=at_seq,
            metadata={**(metadata or {}), FORK_KEY: fork_record(source, at_seq, open_calls)},
            items=items,
            calls=calls,
            messages=list(messages),
            tag=tag,
            status=ThreadStatus.WAITING if waiting else ThreadStatus.IDLE,
        )
    )


def fork_record(source: ThreadInfo, at_seq: int, open_calls: str) -> dict[str, Any]:
    """What a fork keeps about its origin (``FORK_KEY``)."""
    return {
        "source": source.id,
        "at_seq": at_seq,
        "code_version": source.code_version,
        "open_calls": open_calls,
    }


def open_at(store: ForkStore, source: ThreadInfo, at_seq: int) -> list[ToolCall]:
    """The calls of ``source`` that were made at or before ``at_seq`` and not yet answered
    there, in the order the model made them."""
    count = _WINDOW
    while True:
        window = tail(store, source, at_seq, count)
        if at_seq < 1 or not window or window[-1].seq != at_seq:
            last = _last_seq(store, source)
            raise InvalidForkPoint(source.id, at_seq, f"its history runs from 1 to {last}")
        # By kind: a raw item tells it undecoded; only the items from the last turn on are
        # decoded, so a long window costs its reading, not its decoding.
        turns = [i for i, s in enumerate(window) if item_kind(s) == "assistant"]
        if turns or len(window) < count:
            since = window[turns[-1] if turns else 0 :]
            break
        count *= 4
    made = [c for s in since if isinstance(s.item, AssistantTurn) for c in s.item.calls]
    answered = {s.item.call_id for s in since if isinstance(s.item, ToolResult)}
    return [c for c in made if c.call_id not in answered]


def _last_seq(store: ForkStore, source: ThreadInfo) -> int:
    """The source's last seq, for the error message only (it reads the whole history)."""
    return max((s.seq for s in full_history(store, source)), default=0)
