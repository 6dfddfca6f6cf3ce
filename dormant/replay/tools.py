"""``ReplayTools``: how a replay answers its model's tool calls, kept in its metadata."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from dormant.errors import ConfigurationError

__all__ = ["MISS_PREFIX", "Match", "OnMiss", "ReplayTools"]

Match = Literal["args", "name"]
OnMiss = Literal["error", "live", "stop"]

MISS_PREFIX = "Not in the record: "
"""The start of the error result a replay gives a call the record cannot answer: the
diff counts such results as misses."""


@dataclass(frozen=True)
class ReplayTools:
    """How a replay's tool calls are answered.

    Each call is matched against the source's calls after the fork point: by tool name and
    canonical arguments (``match="args"``) or by name alone (``"name"``), and by
    occurrence (the third call with that key gets the third recorded result). A match
    is served the recorded result and the tool never runs. A miss (``on_miss``) is an
    error result the diff counts as a divergence (``"error"``), runs live only if the tool
    is declared ``side_effect_free`` and is an error result otherwise (``"live"``), or
    closes the replay there (``"stop"``)."""

    match: Match = "args"
    on_miss: OnMiss = "error"

    def __post_init__(self) -> None:
        if self.match not in ("args", "name"):
            raise ConfigurationError(f"ReplayTools match {self.match!r} is not 'args' or 'name'")
        if self.on_miss not in ("error", "live", "stop"):
            raise ConfigurationError(
                f"ReplayTools on_miss {self.on_miss!r} is not 'error', 'live' or 'stop'"
            )

    def stored(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> ReplayTools:
        return cls(match=stored.get("match", "args"), on_miss=stored.get("on_miss", "error"))
