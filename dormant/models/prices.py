"""What a completion costs: a price per million tokens, per model name.

``DEFAULT_PRICES`` holds the list prices (US dollars) of the models the docs name; an
agent adds or overrides entries with ``Agent(prices={...})``. A model with no price costs
0: its tokens are still counted, so ``max_tokens`` still bounds it.

The provider adapters name their models ``"openai:gpt-4.1-mini"``, ``"anthropic:..."``
while price pages (and this table) use the bare name: ``price_of`` tries the full name
first, then the bare one, each also without a dated snapshot suffix, so an entry keyed
either way prices the model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dormant.messages import Usage

__all__ = ["DEFAULT_PRICES", "Price", "cost_of", "price_of"]


@dataclass(frozen=True, slots=True)
class Price:
    """Prices per million tokens; ``cached_per_mtok`` is for prompt tokens read from the
    provider's cache (the rest of the input pays ``input_per_mtok``)."""

    input_per_mtok: float
    output_per_mtok: float
    cached_per_mtok: float | None = None
    """None: cached tokens pay the input price."""


DEFAULT_PRICES: Mapping[str, Price] = MappingProxyType(
    {
        "gpt-4.1": Price(2.00, 8.00, 0.50),
        "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
        "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
        "gpt-4o": Price(2.50, 10.00, 1.25),
        "gpt-4o-mini": Price(0.15, 0.60, 0.075),
        "claude-sonnet-4-5": Price(3.00, 15.00, 0.30),
        "claude-haiku-4-5": Price(1.00, 5.00, 0.10),
        "claude-opus-4-1": Price(15.00, 75.00, 1.50),
    }
)
"""List prices in US dollars (OpenAI and Anthropic price pages, late 2025)."""


_DATED = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8})$")
"""A snapshot's date at the end of a model name: ``-2025-04-14`` (OpenAI), ``-20250929``
(Anthropic)."""


def price_of(model_name: str, prices: Mapping[str, Price] = DEFAULT_PRICES) -> Price | None:
    """The entry of ``prices`` for ``model_name``: its full name
    (``"openai:gpt-4.1-mini"``), else its name after the provider prefix
    (``"gpt-4.1-mini"``), else either without a snapshot date
    (``"gpt-4.1-mini-2025-04-14"``); None if there is none."""
    _, _, bare = model_name.partition(":")
    names = (model_name, bare, _DATED.sub("", model_name), _DATED.sub("", bare))
    return next((prices[name] for name in names if name and name in prices), None)


def cost_of(usage: Usage, model_name: str, prices: Mapping[str, Price] = DEFAULT_PRICES) -> float:
    """The cost of one completion's ``usage`` (``input_tokens`` includes the cached ones);
    0 for a model ``prices`` does not name (``price_of``)."""
    price = price_of(model_name, prices)
    if price is None:
        return 0.0
    cached = min(usage.cached_tokens, usage.input_tokens)
    cached_price = price.input_per_mtok if price.cached_per_mtok is None else price.cached_per_mtok
    millionths = (
        (usage.input_tokens - cached) * price.input_per_mtok
        + cached * cached_price
        + usage.output_tokens * price.output_per_mtok
    )
    return millionths / 1_000_000
