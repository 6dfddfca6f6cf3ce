"""A batch of replays: recorded threads of one agent replayed with a change, one report.

``dormant replay --agent support --since 7d --sample 200 --model ... --tag exp42`` picks
the agent's root threads made since then (no fork, replay or child), replays a sample of
them as ordinary slices (background priority, the tag's admission flow and usage), waits
for every replay to finish, and writes one JSON report: each pair's diff and the totals.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from dormant.budget import Budget
from dormant.replay.diff import ReplayDiff
from dormant.replay.tools import ReplayTools
from dormant.stores.base import InboxState, QueryStore, ThreadInfo, ThreadStatus

__all__ = ["finished", "pick_sources", "replay_batch"]

_PAGE = 500


class _Replaying(Protocol):
    store: Any

    def replay(
        self,
        thread_id: str,
        from_seq: int = 1,
        *,
        model: str | None = None,
        instructions: str | None = None,
        tools: ReplayTools | None = None,
        budget: Budget | None = None,
        tag: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str: ...

    def diff(self, source_id: str, replay_id: str, scorer: Any = None) -> ReplayDiff: ...


def pick_sources(
    store: QueryStore, agent: str, since: datetime, sample: int, *, seed: int | None = None
) -> list[ThreadInfo]:
    """Up to ``sample`` of ``agent``'s recorded root threads made at or after ``since``,
    drawn at random (``seed`` repeats a draw), oldest first."""
    found: list[ThreadInfo] = []
    before: tuple[datetime, str] | None = None
    while True:
        page = store.threads(limit=_PAGE, agent=agent, before=before)
        for info in page:
            if info.created_at < since:
                break
            if info.parent_id is None and info.source_id is None:
                found.append(info)
        if len(page) < _PAGE or (page and page[-1].created_at < since):
            break
        before = (page[-1].created_at, page[-1].id)
    chosen = found if len(found) <= sample else random.Random(seed).sample(found, sample)
    return sorted(chosen, key=lambda i: (i.created_at, i.id))


def finished(store: QueryStore, thread_id: str) -> bool:
    """Whether a replay has nothing left to do: closed or stalled, or idle with nothing
    queued (its next input is queued with the turn that answered the last)."""
    info = store.thread(thread_id)
    if info.status in (ThreadStatus.CLOSED, ThreadStatus.STALLED):
        return True
    if info.status is not ThreadStatus.IDLE:
        return False
    waiting = (InboxState.PENDING, InboxState.DEFERRED)
    return not any(r.state in waiting for r in store.inbox(thread_id))


def replay_batch(
    client: _Replaying,
    sources: list[ThreadInfo],
    *,
    tag: str,
    model: str | None = None,
    instructions: str | None = None,
    tools: ReplayTools | None = None,
    budget: Budget | None = None,
    timeout_s: float = 3600.0,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Replay each source, wait (up to ``timeout_s``) for all to finish, and report.

    ``on_progress(finished, total)`` is called at each look at the replays, so a caller
    can show a long batch moving (``dormant replay`` does)."""
    started = datetime.now(UTC)
    pairs = [
        (
            s.id,
            client.replay(
                s.id, model=model, instructions=instructions, tools=tools, budget=budget, tag=tag
            ),
        )
        for s in sources
    ]
    deadline = clock() + timeout_s
    open_ = [r for _, r in pairs]
    while open_ and clock() < deadline:
        open_ = [r for r in open_ if not finished(client.store, r)]
        if on_progress is not None:
            on_progress(len(pairs) - len(open_), len(pairs))
        if open_:
            sleep(poll_s)
    runs = []
    for source_id, replay_id in pairs:
        found = client.diff(source_id, replay_id).as_json()
        status = client.store.thread(replay_id).status
        runs.append({**found, "status": str(status), "finished": replay_id not in open_})
    return {
        "tag": tag,
        "model": model,
        "instructions": instructions,
        "tools": (tools or ReplayTools()).stored(),
        "started_at": started.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "totals": _totals(runs),
        "runs": runs,
    }


def _totals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("completions", "tokens", "cost", "wall_s")
    return {
        "replays": len(runs),
        "same": sum(r["same"] for r in runs),
        "diverged": sum(not r["same"] for r in runs),
        "unfinished": sum(not r["finished"] for r in runs),
        "served": sum(r["served"] for r in runs),
        "missed": sum(r["missed"] for r in runs),
        "live": sum(r["live"] for r in runs),
        "deltas": {k: sum(r["deltas"].get(k, 0) for r in runs) for k in keys},
    }
