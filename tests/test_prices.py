"""Prices through the real provider adapters: ``OpenAIModel`` and ``AnthropicModel`` name
their models ``"openai:..."`` and ``"anthropic:..."``, the price table uses bare names,
and ``max_cost`` must bound them either way (local wire-protocol servers, no internet)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_providers import (
    FakeProvider,
    anthropic_stream,
    no_external_network,  # noqa: F401  (autouse guard)
    openai_stream,
)

from dormant import Agent, Budget, LocalSystem
from dormant.messages import Usage
from dormant.models import AnthropicModel, Model, OpenAIModel
from dormant.models.prices import DEFAULT_PRICES, Price, cost_of, price_of
from dormant.models.registry import _anthropic_model, _openai_model
from dormant.stores.base import ThreadStatus

MINI = DEFAULT_PRICES["gpt-4.1-mini"]
HAIKU = DEFAULT_PRICES["claude-haiku-4-5"]


@pytest.fixture
def openai_server() -> Iterator[FakeProvider]:
    with FakeProvider.openai() as fake:
        fake.repeat(openai_stream(["ok"], usage=(100_000, 10_000, 0)))
        yield fake


@pytest.fixture
def anthropic_server() -> Iterator[FakeProvider]:
    with FakeProvider.anthropic() as fake:
        fake.repeat(anthropic_stream(["ok"], usage=(100_000, 10_000, 0, 0)))
        yield fake


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    """Model strings resolve to one shared model per name: one made for another test's
    server must not answer here."""
    _openai_model.cache_clear()
    _anthropic_model.cache_clear()
    yield
    for cached in (_openai_model, _anthropic_model):
        cached.cache_clear()


def spend_then_stop(agent: Agent, max_cost: float) -> tuple[float, str, float]:
    """One reply, then a second message the budget refuses: (ledger cost, the stall's
    reason, the tree's cost)."""
    with LocalSystem([agent], "memory://") as system:
        thread_id = system.launch(agent.name, "triage this", budget=Budget(max_cost=max_cost))
        system.run_until_idle()
        system.send(thread_id, "and this")
        system.run_until_idle(raise_on_failure=False)
        info = system.thread(thread_id)
        assert info.status is ThreadStatus.STALLED
        cost = system.store.usage(thread_id=thread_id)[agent.name].cost
        return cost, info.last_error, info.tree_cost


def expected(price: Price) -> float:
    return (100_000 * price.input_per_mtok + 10_000 * price.output_per_mtok) / 1_000_000


def test_an_openai_model_object_is_priced_and_its_max_cost_stops_the_thread(
    openai_server: FakeProvider,
) -> None:
    model = OpenAIModel("gpt-4.1-mini", base_url=openai_server.base_url, api_key="k")
    assert model.name == "openai:gpt-4.1-mini"
    cost, reason, tree_cost = spend_then_stop(Agent("triage", model=model), max_cost=0.05)
    model.close()
    assert cost == pytest.approx(expected(MINI)) == pytest.approx(0.056)
    assert tree_cost == pytest.approx(cost)
    assert reason.startswith("budget: max_cost 0.056/0.05")
    assert len(openai_server.requests) == 1  # the second call was refused


def test_the_docs_model_string_is_priced_and_its_max_cost_stops_the_thread(
    openai_server: FakeProvider, fresh_registry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    triage = Agent("triage", model="openai:gpt-4.1-mini", budget=Budget(max_cost=5.0))
    cost, reason, _ = spend_then_stop(triage, max_cost=0.05)
    assert cost == pytest.approx(expected(MINI))
    assert reason.startswith("budget: max_cost 0.056/0.05")


def test_an_anthropic_model_object_and_string_are_priced(
    anthropic_server: FakeProvider, fresh_registry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = AnthropicModel("claude-haiku-4-5", base_url=anthropic_server.base_url, api_key="k")
    cost, reason, _ = spend_then_stop(Agent("haiku", model=model), max_cost=0.1)
    model.close()
    assert cost == pytest.approx(expected(HAIKU)) == pytest.approx(0.15)
    assert reason.startswith("budget: max_cost 0.15/0.1")

    monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic_server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    cost, _, _ = spend_then_stop(Agent("haiku", model="anthropic:claude-haiku-4-5"), 0.1)
    assert cost == pytest.approx(expected(HAIKU))


@pytest.mark.parametrize("key", ["gpt-4.1-mini", "openai:gpt-4.1-mini"])
def test_an_agents_own_price_is_found_keyed_with_or_without_the_provider(
    openai_server: FakeProvider, key: str
) -> None:
    model: Model = OpenAIModel("gpt-4.1-mini", base_url=openai_server.base_url, api_key="k")
    own = Price(input_per_mtok=1.0, output_per_mtok=10.0)
    agent = Agent("triage", model=model, prices={key: own})
    cost, reason, _ = spend_then_stop(agent, max_cost=0.1)
    model.close()  # type: ignore[attr-defined]
    assert cost == pytest.approx(0.2)  # 100k * 1 + 10k * 10, per million
    assert reason.startswith("budget: max_cost 0.2/0.1")


def test_a_full_name_entry_wins_over_a_bare_one_and_snapshot_dates_are_priced() -> None:
    bare, full = Price(1.0, 1.0), Price(2.0, 2.0)
    prices = {"gpt-4.1-mini": bare, "openai:gpt-4.1-mini": full}
    assert price_of("openai:gpt-4.1-mini", prices) is full
    assert price_of("gpt-4.1-mini", prices) is bare
    assert price_of("openai:gpt-4.1-mini-2025-04-14") is MINI
    assert price_of("anthropic:claude-haiku-4-5-20251001") is HAIKU
    assert price_of("openai:my-model") is None
    assert cost_of(Usage(input_tokens=1_000_000), "anthropic:claude-haiku-4-5") == 1.0
