"""Budgets in a slice: the check before every model call, and what the calls spent.

``Meter`` is made once per slice that calls its model. ``check`` refuses a call once a
limit of the thread's budget is reached (``BudgetExceeded``: the slice then writes nothing
but a compaction summary it already paid for, and the thread stalls at once, see
``failures.py``); ``charge`` adds a completion's usage and cost; the slice commits
``spend`` (a ledger row, added to the root's tree totals) and ``message_completions``. A
limit reached after the slice's first reply stops it there: it commits the turns it made
(their usage counted), the results its model has not read yet queued in its inbox
(``calls.hold_back``), and the thread stalls right after.

The budget is the root's own (``launch(..., budget=...)``, ``raise_budget``) if it has
one, else the agent's. ``max_tokens`` and ``max_cost`` count the whole tree, read from
the root's totals when the slice starts plus what this slice spent; another slice of the
tree running at the same moment is not seen, so a tree may pass a limit by what its
concurrent slices spend at once, never by more.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from dormant.agents import Agent
from dormant.budget import BUDGET_KEY, LIMITS, Budget
from dormant.errors import BudgetExceeded
from dormant.messages import Usage, UserText
from dormant.models.base import Model, ModelSettings
from dormant.models.prices import cost_of
from dormant.stores.base import SliceStore, Spend, Store, StoredItem, ThreadInfo, ThreadStatus

__all__ = ["Meter", "budget_of", "raise_limits", "stalled_by_budget"]

BUDGET_MARK = "budget: "
"""How ``last_error`` starts on a thread its budget stopped (``BudgetExceeded``)."""


def budget_of(agent: Agent, root: ThreadInfo) -> Budget:
    """The budget of ``root``'s tree: its own, else its agent's."""
    own: dict[str, Any] | None = root.metadata.get(BUDGET_KEY)
    return agent.budget.over(own)


@dataclass
class Meter:
    """One slice's model use against the thread's budget."""

    thread: ThreadInfo
    budget: Budget
    model: Model
    agent: Agent
    root_tokens: int
    root_cost: float
    message_completions: int
    """The thread's own completions since its last user text, this slice's included."""
    spend: Spend = field(default_factory=Spend)
    replies: int = 0
    """This slice's completions other than compaction summaries."""
    stopped: str = ""
    """Why the slice stopped calling its model after a first reply (``allows_another``)."""

    @classmethod
    def start(
        cls,
        store: SliceStore,
        agent: Agent,
        model: Model,
        thread: ThreadInfo,
        new: list[StoredItem],
    ) -> Meter:
        """The meter of a slice of ``thread`` that applied ``new`` items (user text among
        them resets the per-message count)."""
        root = thread if thread.root_id in ("", thread.id) else store.thread(thread.root_id)
        fresh = any(isinstance(s.item, UserText) for s in new)
        return cls(
            thread,
            budget_of(agent, root),
            model,
            agent,
            root.tree_tokens,
            root.tree_cost,
            0 if fresh else thread.message_completions,
        )

    def allows_another(self) -> bool:
        """Whether the slice may call its model again for a reply. Before its first reply
        a reached limit raises ``BudgetExceeded`` (the slice consumes nothing: the user's
        message must not be consumed without a reply; a compaction summary made just
        before is kept alone, see ``SliceCommit._keep_summary``); after it, the slice stops
        calling, commits what it made, then stalls the thread with ``stopped``."""
        if not self.replies:
            self.check()
            return True
        try:
            self.check()
        except BudgetExceeded as error:
            self.stopped = str(error)
            return False
        return True

    def check(self) -> None:
        """Raise ``BudgetExceeded`` if a limit is reached: no model call may be made."""
        budget, tid = self.budget, self.thread.id
        cap = budget.max_completions_per_message
        if cap is not None and self.message_completions >= cap:
            limit = "max_completions_per_message"
            raise BudgetExceeded(tid, limit, self.message_completions, cap)
        tokens = self.root_tokens + self.spend.tokens
        if budget.max_tokens is not None and tokens >= budget.max_tokens:
            raise BudgetExceeded(tid, "max_tokens", tokens, budget.max_tokens)
        cost = self.root_cost + self.spend.cost
        if budget.max_cost is not None and cost >= budget.max_cost:
            raise BudgetExceeded(tid, "max_cost", cost, budget.max_cost)

    def charge(self, usage: Usage, *, summary: bool = False) -> None:
        """Add one completion; a compaction ``summary`` is not a reply to the user's
        message, so it does not count towards the per-message cap."""
        cost = cost_of(usage, self.model.name, self.agent.price_table)
        spent = self.spend
        self.spend = Spend(
            spent.completions + 1,
            spent.input_tokens + usage.input_tokens,
            spent.output_tokens + usage.output_tokens,
            spent.cached_tokens + usage.cached_tokens,
            spent.cost + cost,
        )
        if not summary:
            self.replies += 1
            self.message_completions += 1

    def settings(self, settings: ModelSettings) -> ModelSettings:
        """``settings`` for the next completion: ``tool_choice`` only on the first one
        after the user's message, unless ``tool_choice_every_turn``."""
        if settings.tool_choice is None or settings.tool_choice_every_turn:
            return settings
        if self.message_completions == 0:
            return settings
        return replace(settings, tool_choice=None)


def raise_limits(store: Store, thread_id: str, limits: dict[str, float | None]) -> list[str]:
    """Store the limits given (None: unchanged) in the budget of ``thread_id``'s tree, on
    its root; the threads of the tree its budget stopped, ``thread_id`` first if it is one
    (the caller retries them)."""
    thread = store.thread(thread_id)
    root_id = thread.root_id or thread.id
    root = thread if root_id == thread.id else store.thread(root_id)
    given = {k: v for k, v in limits.items() if k in LIMITS and v is not None}
    Budget().over(given)  # refuses what a budget refuses (a limit not positive)
    stored = {**(root.metadata.get(BUDGET_KEY) or {}), **given}
    store.set_metadata(root_id, {**root.metadata, BUDGET_KEY: stored})
    tree = [root]
    for member in tree:
        tree += store.children(member.id)
    stopped = [t.id for t in tree if stalled_by_budget(t)]
    return sorted(stopped, key=lambda tid: tid != thread_id)


def stalled_by_budget(thread: ThreadInfo) -> bool:
    return thread.status is ThreadStatus.STALLED and thread.last_error.startswith(BUDGET_MARK)
