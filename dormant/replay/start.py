"""Starting a replay: a fork just before a recorded user message, with that message queued.

The replay's metadata (``REPLAY_KEY``) is all a worker needs to run it: the source, the
fork point, the model and instructions to use instead of the agent's, ``ReplayTools``, the
tag and the source agent's version. Its first input is queued at background priority in
the creating transaction, and its flow for admission is the tag's (``"tenant"``), so
replays share model capacity with one another, not ahead of production.
"""

from __future__ import annotations

from typing import Any

from dormant.budget import Budget, with_budget
from dormant.errors import InvalidForkPoint
from dormant.messages import UserMessage, UserText
from dormant.replay.agent import REPLAY_KEY
from dormant.replay.record import INPUT_PREFIX
from dormant.replay.tools import ReplayTools
from dormant.runtime.forks import ForkStore, fork_thread
from dormant.stores.base import Priority, ThreadInfo
from dormant.stores.lineage import tail

__all__ = ["start_replay"]


def start_replay(
    store: ForkStore,
    thread_id: str,
    from_seq: int = 1,
    *,
    model: str | None = None,
    instructions: str | None = None,
    tools: ReplayTools | None = None,
    budget: Budget | None = None,
    tag: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> ThreadInfo:
    """Make the replay of ``thread_id`` from its user message at ``from_seq`` and return
    it (nothing is woken). ``InvalidForkPoint`` unless that item is user text."""
    source = store.thread(thread_id)
    first = tail(store, source, from_seq, 1) if from_seq >= 1 else []
    if not first or first[-1].seq != from_seq or not isinstance(first[-1].item, UserText):
        raise InvalidForkPoint(source.id, from_seq, "a replay starts at recorded user text")
    record = {
        "source": source.id,
        "from_seq": from_seq,
        "fork_seq": from_seq - 1,
        "tag": tag or "",
        "model": model,  # None: the source agent's own model
        "instructions": instructions,
        "tools": (tools or ReplayTools()).stored(),
        "code_version": source.code_version,
    }
    given = {**(metadata or {}), REPLAY_KEY: record, "tenant": f"replay:{tag or ''}"}
    text = first[-1].item.text
    message = (f"{INPUT_PREFIX}{from_seq}", UserMessage(text=text), int(Priority.BACKGROUND))
    return fork_thread(
        store,
        source.id,
        from_seq - 1,
        metadata=with_budget(given, budget),
        messages=[message],
        tag=f"replay:{tag or ''}",
    )
