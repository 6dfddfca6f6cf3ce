"""What the CLI shows about model usage: the ledger per agent (``dormant usage``) and a
thread's usage and budget (``dormant show``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from dormant.budget import BUDGET_KEY, LIMITS
from dormant.errors import ConfigurationError
from dormant.ops.prune import parse_age
from dormant.stores.base import QueryStore, Spend, ThreadInfo

__all__ = [
    "budget_text",
    "parse_since",
    "spend_record",
    "thread_usage",
    "usage_line",
    "usage_table",
]


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``1h``, ``30m``, ``7d`` (that long ago) or an ISO time (UTC unless it says)."""
    try:
        return (now or datetime.now(UTC)) - parse_age(text)
    except ConfigurationError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"--since {text!r} is neither an age (1h, 30m, 7d) nor an ISO time"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def usage_table(usage: dict[str, Spend]) -> Table:
    """One row per agent, and a total when there are several."""
    table = Table("agent", "completions", "tokens in", "tokens out", "cached", "cost")
    for name, spend in usage.items():
        table.add_row(Text(name), *_cells(spend))  # a name, never markup: `[replay:tag]`
    if len(usage) > 1:
        total = sum(usage.values(), Spend())
        table.add_row(Text("total", style="bold"), *_cells(total))
    return table


def _cells(spend: Spend) -> list[str]:
    return [
        f"{spend.completions:,}",
        f"{spend.input_tokens:,}",
        f"{spend.output_tokens:,}",
        f"{spend.cached_tokens:,}",
        f"{spend.cost:.6f}",
    ]


def thread_usage(store: QueryStore, info: ThreadInfo) -> Spend:
    """What the thread's own slices spent (its ledger rows)."""
    return sum(store.usage(thread_id=info.id).values(), Spend())


def usage_line(store: QueryStore, info: ThreadInfo) -> Text:
    """The thread's own usage; on a root, its tree's totals and its own budget if it has
    one; the per-message count."""
    spend = thread_usage(store, info)
    line = Text.assemble(
        ("usage ", "dim"),
        f"{spend.completions} completions, {spend.input_tokens:,} tokens in, "
        f"{spend.output_tokens:,} out, {spend.cached_tokens:,} cached, cost {spend.cost:.6f}; "
        f"{info.message_completions} completions since the last user message",
    )
    if info.parent_id is None:
        line.append(f"\ntree   {info.tree_tokens:,} tokens, cost {info.tree_cost:.6f}", "dim")
        own = info.metadata.get(BUDGET_KEY)
        line.append(f"; budget {budget_text(own)}", "dim")
    return line


def budget_text(stored: dict[str, Any] | None) -> str:
    """A root's stored budget as shown: its limits; those it does not store (a
    ``raise_budget`` on the agent's budget stores only those raised) are the agent's."""
    if not stored:
        return "the agent's"
    text = ", ".join(f"{k}={v}" for k, v in stored.items())
    agents = [k for k in LIMITS if k not in stored]
    return f"{text}; the agent's {', '.join(agents)}" if agents else text


def spend_record(spend: Spend) -> dict[str, Any]:
    return {
        "completions": spend.completions,
        "input_tokens": spend.input_tokens,
        "output_tokens": spend.output_tokens,
        "cached_tokens": spend.cached_tokens,
        "cost": spend.cost,
    }
