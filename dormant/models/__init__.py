"""Models: the protocol, scripted and simulated models, and the provider adapters."""

from dormant.models.base import ChunkSink, Completion, Model, ModelRequest, ModelSettings, ToolSpec
from dormant.models.scripted import ScriptedModel, call, reply
from dormant.models.simulated import SimulatedModel

__all__ = [
    "ChunkSink",
    "Completion",
    "Model",
    "ModelRequest",
    "ModelSettings",
    "ScriptedModel",
    "SimulatedModel",
    "ToolSpec",
    "call",
    "reply",
]
