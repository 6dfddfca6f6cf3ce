"""``Budget``: what a thread tree may spend on its model before it stops and waits.

An agent has one (``Agent(budget=...)``); a launch may replace it for the tree it starts
(``launch(..., budget=...)``, kept in the root's metadata under ``"budget"``), and
``raise_budget`` changes it there later. ``runtime/budgets.py`` checks it before every
model call.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from dormant.errors import ConfigurationError

__all__ = ["BUDGET_KEY", "DEFAULT_MAX_COMPLETIONS_PER_MESSAGE", "LIMITS", "Budget", "with_budget"]

DEFAULT_MAX_COMPLETIONS_PER_MESSAGE = 50
"""The out-of-the-box cap: no agent calls its model more than this many times for one
user message (a model that calls a tool on every turn stops instead of looping for ever)."""

BUDGET_KEY = "budget"
"""The key of a thread tree's own budget in its root's metadata."""


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits on model use; ``None`` is no limit.

    ``max_completions_per_message`` counts a thread's own completions since the last user
    text it applied (compaction summaries excluded); ``max_tokens`` (input + output) and
    ``max_cost`` (in the price table's currency, US dollars for the defaults of
    ``dormant.models.prices``) count the whole tree: the root, its children and its event
    threads. A model call is refused once a limit is reached.
    """

    max_completions_per_message: int | None = DEFAULT_MAX_COMPLETIONS_PER_MESSAGE
    max_tokens: int | None = None
    max_cost: float | None = None

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and not value > 0:
                raise ConfigurationError(f"Budget.{name} must be positive or None, not {value}")

    def as_metadata(self) -> dict[str, Any]:
        return asdict(self)

    def over(self, stored: dict[str, Any] | None) -> Budget:
        """This (an agent's) budget with the limits a root's metadata sets: all three
        after a launch with a budget, the raised ones after ``raise_budget``."""
        if not stored:
            return self
        return replace(self, **{k: stored[k] for k in LIMITS if k in stored})


LIMITS = ("max_completions_per_message", "max_tokens", "max_cost")


def with_budget(metadata: dict[str, Any] | None, budget: Budget | None) -> dict[str, Any]:
    """A launch's metadata, with its budget (all limits: it replaces the agent's)."""
    if budget is None:
        return dict(metadata or {})
    return {**(metadata or {}), BUDGET_KEY: budget.as_metadata()}
