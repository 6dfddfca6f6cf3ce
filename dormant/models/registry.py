"""Model strings (``"openai:gpt-4.1-mini"``) resolved to model objects."""

from __future__ import annotations

import functools
from collections.abc import Callable

from dormant.errors import ConfigurationError
from dormant.models.base import Model

__all__ = ["register_provider", "resolve_model"]

_PROVIDERS: dict[str, Callable[[str], Model]] = {}


def register_provider(prefix: str, factory: Callable[[str], Model]) -> None:
    """Make ``"{prefix}:{name}"`` strings build models with ``factory(name)``."""
    _PROVIDERS[prefix] = factory


def resolve_model(spec: str) -> Model:
    prefix, sep, name = spec.partition(":")
    if not sep or not name:
        raise ConfigurationError(f"model string {spec!r} must look like 'provider:model-name'")
    _register_builtin_providers()
    factory = _PROVIDERS.get(prefix)
    if factory is None:
        known = ", ".join(sorted(_PROVIDERS)) or "none"
        raise ConfigurationError(f"unknown model provider {prefix!r} in {spec!r}; known: {known}")
    return factory(name)


def _register_builtin_providers() -> None:
    from dormant.models.scripted import ScriptedModel  # noqa: F401  (no string form)
    from dormant.models.simulated import SimulatedModel

    _PROVIDERS.setdefault("simulated", lambda _name: SimulatedModel())
    _PROVIDERS.setdefault("openai", _openai_model)
    _PROVIDERS.setdefault("anthropic", _anthropic_model)


@functools.cache
def _openai_model(name: str) -> Model:
    """One shared model (and connection pool) per name; keys and URLs from the SDK's env vars.

    Agents resolve their model string in every slice: a new client each time would
    reconnect to the provider for every completion.
    """
    from dormant.models.openai_model import OpenAIModel

    return OpenAIModel(name)


@functools.cache
def _anthropic_model(name: str) -> Model:
    """One shared model per name, like ``_openai_model``."""
    from dormant.models.anthropic_model import AnthropicModel

    return AnthropicModel(name)
