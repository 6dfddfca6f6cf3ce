"""``diff``: how a replay differs from its source, from their stored histories alone.

Both are read past the replay's fork point, as steps a person compares: user text, the
model's text, each call (tool and canonical arguments) and each result. Call ids are left
out: a live model makes new ones. The first step that differs is the first divergence;
the tool-sequence distance is the edit distance between the two lists of calls. The
replay's results are counted by where they came from: served from the record, missed
(``MISS_PREFIX``) or run live (a tool task's result, ``result:<call_id>``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from dormant.messages import AssistantTurn, EventShown, Item, Summary, ToolResult, UserText
from dormant.replay.record import THREAD_BUILTINS, canonical
from dormant.replay.tools import MISS_PREFIX
from dormant.stores.base import QueryStore, Spend, StoredItem, ThreadInfo
from dormant.stores.lineage import full_history
from dormant.tools.builtins import BUILTINS

__all__ = ["Divergence", "ReplayDiff", "Scorer", "diff_threads", "edit_distance"]

Scorer = Callable[[str, str], Any]
"""Given the source's final answer and the replay's: a verdict, kept in the diff as is
(a number, a bool, a short text). It must return something JSON can hold."""


@dataclass(frozen=True)
class Divergence:
    """The first step where the two differ; a missing side is an empty string."""

    step: int
    source_seq: int | None
    replay_seq: int | None
    source: str
    replay: str


@dataclass(frozen=True)
class ReplayDiff:
    source_id: str
    replay_id: str
    first_divergence: Divergence | None
    tool_distance: int
    """Calls to add, drop or change to turn the source's list of calls into the replay's."""
    served: int
    missed: int
    live: int
    source_answer: str
    replay_answer: str
    source_usage: dict[str, float] = field(default_factory=dict)
    replay_usage: dict[str, float] = field(default_factory=dict)
    deltas: dict[str, float] = field(default_factory=dict)
    """Replay minus source: completions, tokens, cost, and ``wall_s`` (each thread's first
    to last write; a source's includes the time its users took to answer)."""
    verdict: Any = None

    @property
    def same(self) -> bool:
        """Whether the replay did step for step what its source did."""
        return self.first_divergence is None and self.tool_distance == 0

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "same": self.same}


def diff_threads(
    store: QueryStore, source_id: str, replay_id: str, scorer: Scorer | None = None
) -> ReplayDiff:
    """Compare ``replay_id`` with ``source_id`` past the replay's fork point."""
    replay = store.thread(replay_id)
    source = store.thread(source_id)
    fork = replay.fork_seq or 0
    theirs = [s for s in full_history(store, source) if s.seq > fork]
    ours = [
        s
        for s in full_history(store, replay)
        if s.seq > fork and not s.message_id.startswith("fork:")
    ]
    a, b = _steps(theirs), _steps(ours)
    served, missed, live = _origins(ours)
    source_answer, replay_answer = _answer(theirs), _answer(ours)
    source_usage = _usage(store, source)
    replay_usage = _usage(store, replay)
    return ReplayDiff(
        source_id=source.id,
        replay_id=replay.id,
        first_divergence=_first_divergence(a, b),
        tool_distance=edit_distance(_calls(theirs), _calls(ours)),
        served=served,
        missed=missed,
        live=live,
        source_answer=source_answer,
        replay_answer=replay_answer,
        source_usage=source_usage,
        replay_usage=replay_usage,
        deltas={k: replay_usage[k] - source_usage[k] for k in replay_usage},
        verdict=scorer(source_answer, replay_answer) if scorer is not None else None,
    )


def edit_distance(a: list[Any], b: list[Any]) -> int:
    """Levenshtein distance between two sequences (insert, delete, replace cost 1)."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def _steps(items: list[StoredItem]) -> list[tuple[int, str]]:
    steps: list[tuple[int, str]] = []
    for stored in items:
        steps += [(stored.seq, text) for text in _describe(stored.item)]
    return steps


def _describe(item: Item) -> list[str]:
    match item:
        case UserText(text=text):
            return [f"user: {text}"]
        case AssistantTurn(text=text, calls=calls):
            said = [f"model: {text}"] if text else []
            return said + [f"call {c.name}({canonical(c.args)})" for c in calls]
        case ToolResult(name=name, content=content, is_error=is_error):
            return [f"{'error' if is_error else 'result'} of {name}: {content}"]
        case EventShown(original_name=name, content=content):
            return [f"event on {name}: {content}"]
        case Summary():
            return []  # a compaction is bookkeeping, not behaviour
    return [repr(item)]


def _first_divergence(a: list[tuple[int, str]], b: list[tuple[int, str]]) -> Divergence | None:
    for i in range(max(len(a), len(b))):
        left = a[i] if i < len(a) else (None, "")
        right = b[i] if i < len(b) else (None, "")
        if left[1] != right[1]:
            return Divergence(i, left[0], right[0], left[1], right[1])
    return None


def _calls(items: list[StoredItem]) -> list[tuple[str, str]]:
    return [
        (c.name, canonical(c.args))
        for s in items
        if isinstance(s.item, AssistantTurn)
        for c in s.item.calls
    ]


def _origins(items: list[StoredItem]) -> tuple[int, int, int]:
    """The replay's tool results: served from the record, missed, run live."""
    served = missed = live = 0
    for stored in items:
        result = stored.item
        if not isinstance(result, ToolResult):
            continue
        if result.name in BUILTINS and result.name not in THREAD_BUILTINS:
            continue
        if stored.message_id.startswith("result:"):
            live += 1
        elif result.is_error and result.content.startswith(MISS_PREFIX):
            missed += 1
        else:
            served += 1
    return served, missed, live


def _answer(items: list[StoredItem]) -> str:
    """The last text the model said."""
    texts = [s.item.text for s in items if isinstance(s.item, AssistantTurn) and s.item.text]
    return texts[-1] if texts else ""


def _usage(store: QueryStore, thread: ThreadInfo) -> dict[str, float]:
    spend = sum(store.usage(thread_id=thread.id).values(), Spend())
    return {
        "completions": spend.completions,
        "tokens": spend.tokens,
        "cost": spend.cost,
        "wall_s": (thread.updated_at - thread.created_at).total_seconds(),
    }
