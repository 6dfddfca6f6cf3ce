"""Models: the protocol, scripted and simulated models, and the provider adapters.

``OpenAIModel`` and ``AnthropicModel`` are imported on first use: the core imports this
package for the protocol and must not pay for (or depend on) the provider SDKs.
"""

from typing import TYPE_CHECKING

from dormant.models.base import (
    ChunkSink,
    Completion,
    Model,
    ModelRequest,
    ModelSettings,
    ToolChoice,
    ToolSpec,
)
from dormant.models.scripted import ScriptedModel, call, reply
from dormant.models.simulated import SimulatedModel
from dormant.rate_limit import RateLimit

if TYPE_CHECKING:
    from dormant.models.anthropic_model import AnthropicModel
    from dormant.models.openai_model import OpenAIModel

__all__ = [
    "AnthropicModel",
    "ChunkSink",
    "Completion",
    "Model",
    "ModelRequest",
    "ModelSettings",
    "OpenAIModel",
    "RateLimit",
    "ScriptedModel",
    "SimulatedModel",
    "ToolChoice",
    "ToolSpec",
    "call",
    "reply",
]


def __getattr__(name: str) -> object:
    if name == "OpenAIModel":
        from dormant.models.openai_model import OpenAIModel

        return OpenAIModel
    if name == "AnthropicModel":
        from dormant.models.anthropic_model import AnthropicModel

        return AnthropicModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
