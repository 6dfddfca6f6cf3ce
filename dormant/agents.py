"""Agent definitions and the registry workers and local systems resolve names against."""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from dormant.budget import Budget
from dormant.errors import ConfigurationError, DormantError, UnknownAgent
from dormant.messages import EVENT_TOOL_NAME
from dormant.models.base import Model, ModelSettings, ToolSpec
from dormant.models.prices import DEFAULT_PRICES, Price
from dormant.stores.base import CallRecord, CallState, ThreadInfo
from dormant.tools.approval import ApprovalRule
from dormant.tools.base import Tool
from dormant.tools.builtins import BUILTINS, THREAD_TOOLS, offered_builtins

if TYPE_CHECKING:
    from dormant.approvals import PendingApproval
    from dormant.settings import Settings

__all__ = ["NO_AGENTS", "Agent", "AgentRegistry", "AgentSource", "Steering", "load_agents"]

Steering = Literal["enqueue", "interrupt", "reject"]


@dataclass(frozen=True)
class Agent:
    """A named agent: its model, instructions and tools (plus the built-ins that apply).

    ``threads=True`` lets the agent spawn child threads and message them (the
    ``spawn_thread`` and ``send_message_to_child`` built-ins); it is off by default
    because most agents never fork, and every offered tool costs tokens on every request.
    ``model`` is a ``Model`` or a registry string such as ``"openai:gpt-4.1-mini"``,
    resolved when a slice first needs it. ``compact_at`` is the share of the model's
    context window past which the next slice compacts the history.
    ``close_after_idle_s`` (off by default) closes a thread of this agent that stayed idle
    (no call pending, nothing queued) that long after its last slice: the sweeper does it,
    as ``close_thread`` would, with the reason "idle for more than N s".
    ``budget`` bounds what a thread tree of this agent spends on its model (a launch may
    give its tree another); by default 50 completions per user message, nothing else.
    ``prices`` adds to or overrides ``dormant.models.prices.DEFAULT_PRICES`` by model name.
    """

    name: str
    model: Model | str
    instructions: str = ""
    tools: Sequence[Tool] = ()
    model_settings: ModelSettings = field(default_factory=ModelSettings)
    compact_at: float = 0.75
    steering: Steering = "enqueue"
    threads: bool = False
    close_after_idle_s: float | None = None
    budget: Budget = field(default_factory=Budget)
    prices: Mapping[str, Price] = field(default_factory=dict)
    weight: float = 1.0
    """This agent's share of model capacity when calls queue for admission (a weight 2
    agent's deferred threads are woken twice as often as a weight 1 agent's)."""
    version: str = ""
    """What the deploy calls this agent's code ("2026-12-03", a git sha); when empty, a
    fingerprint of its instructions, model and tool schemas (``fingerprint``)."""
    aliases: Sequence[str] = ()
    """Earlier names of this agent: threads launched under one of them run this agent."""
    approval: Mapping[str, ApprovalRule] = field(default_factory=dict)
    """Approval by tool name pattern (``{"github.*": True}``), for tools that are not this
    agent's own code (MCP, HTTP, built-ins); a tool's own ``approval`` comes first."""
    on_approval_requested: Callable[[PendingApproval], Any] | None = None
    """Called once a call is held for approval (to tell Slack or send an email), off the
    slice, as an outbox row: at least once, like a tool; an exception is logged."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ConfigurationError(f"agent name {self.name!r} must be letters, digits, - or _")
        names = [n for t in self.tools for n in t.names]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigurationError(f"agent {self.name!r} has duplicate tools: {duplicates}")
        clashes = sorted(set(names) & (set(BUILTINS) | {EVENT_TOOL_NAME}))
        if clashes:
            raise ConfigurationError(f"agent {self.name!r} tools use reserved names: {clashes}")
        if not 0 < self.compact_at <= 1:
            raise ConfigurationError(f"agent {self.name!r}: compact_at must be in (0, 1]")
        if self.close_after_idle_s is not None and not self.close_after_idle_s > 0:
            raise ConfigurationError(f"agent {self.name!r}: close_after_idle_s must be positive")
        if self.name in self.aliases:
            raise ConfigurationError(f"agent {self.name!r} lists its own name as an alias")
        if not self.weight > 0:
            raise ConfigurationError(f"agent {self.name!r}: weight must be positive")

    def tool(self, name: str) -> Tool | None:
        """The tool called ``name`` (built-ins included); never the reserved event name.

        The thread tools exist only when ``threads`` is on, so a call to one otherwise
        gets a "does not exist" error result. Other built-ins that are not offered in a
        situation still answer a call with an error saying why (a root has no parent).
        """
        for t in self.tools:
            if name in t.names:
                return t
        if name in THREAD_TOOLS and not self.threads:
            return None
        return BUILTINS.get(name)

    @functools.cached_property
    def fingerprint(self) -> str:
        """``version``, or 12 hex digits of a digest of what the model sees of this agent
        (instructions, model, tool schemas): two deploys with the same fingerprint run the
        same agent."""
        if self.version:
            return self.version
        model = self.model if isinstance(self.model, str) else self.model.name
        shape = [self.instructions, model, [(s.name, s.parameters) for s in self._own_specs]]
        text = json.dumps(shape, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def tool_names(self) -> frozenset[str]:
        """Every name a call may use for this agent's own tools, aliases included."""
        return frozenset(n for t in self.tools for n in t.names)

    @functools.cached_property
    def _own_specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec() for t in self.tools)

    def specs(
        self, thread: ThreadInfo | None = None, calls: Iterable[CallRecord] = ()
    ) -> list[ToolSpec]:
        """What the model is offered in ``thread`` (a root when None): the agent's tools,
        then the built-ins that apply there (see ``offered_builtins``).

        ``calls`` are the thread's calls; an open subscription offers
        ``cancel_subscription``. A child's inherited spawn call is not its own.
        """
        parent_call = thread.parent_call_id if thread is not None else None
        subscribed = any(
            c.subscription and c.state is CallState.SUBSCRIBED and c.call_id != parent_call
            for c in calls
        )
        names = offered_builtins(
            threads=self.threads,
            child=thread is not None and thread.parent_id is not None,
            subscribed=subscribed,
        )
        return [*self._own_specs, *(BUILTINS[n].spec() for n in names)]

    @functools.cached_property
    def price_table(self) -> Mapping[str, Price]:
        """The default prices with this agent's own on top."""
        return {**DEFAULT_PRICES, **self.prices}

    def resolved_model(self) -> Model:
        if isinstance(self.model, str):
            from dormant.models.registry import resolve_model

            return resolve_model(self.model)
        return self.model


class AgentRegistry(Mapping[str, Agent]):
    """Agents by name; ``get_agent`` raises ``UnknownAgent`` naming what is registered."""

    def __init__(self, agents: Iterable[Agent] = ()) -> None:
        self._agents: dict[str, Agent] = {}
        self._aliases: dict[str, Agent] = {}
        for agent in agents:
            self.add(agent)

    def add(self, agent: Agent) -> None:
        if agent.name in self._agents and self._agents[agent.name] is not agent:
            raise ConfigurationError(f"two different agents are named {agent.name!r}")
        for alias in agent.aliases:
            taken = self._agents.get(alias) or self._aliases.get(alias)
            if taken is not None and taken is not agent:
                raise ConfigurationError(
                    f"agent {agent.name!r} has the alias {alias!r}, which names {taken.name!r}"
                )
        self._agents[agent.name] = agent
        self._aliases.update(dict.fromkeys(agent.aliases, agent))

    def get_agent(self, name: str) -> Agent:
        """The agent called ``name``, or the one that has it as an alias (a renamed agent's
        threads keep their stored name)."""
        agent = self._agents.get(name) or self._aliases.get(name)
        if agent is None:
            raise UnknownAgent(name, list(self._agents))
        return agent

    def __getitem__(self, name: str) -> Agent:
        return self._agents[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._agents)

    def __len__(self) -> int:
        return len(self._agents)

    @classmethod
    def from_module(cls, path: str) -> AgentRegistry:
        """Every ``Agent`` defined at the top level of the module at ``path`` (``myapp.agents``);
        a module may instead define ``AGENTS``, a list of agents."""
        try:
            module = importlib.import_module(path)
        except DormantError:
            raise  # already says what is wrong (an Agent given a bad option)
        except ImportError as error:
            raise ConfigurationError(f"cannot import agents module {path!r}: {error}") from error
        except Exception as error:  # the module raised: a key read on a host without it
            first = f"{type(error).__name__}: {error}".splitlines()[0]
            raise ConfigurationError(f"the agents module {path!r} raised {first}") from error
        agents = getattr(module, "AGENTS", None)
        if agents is None:
            agents = [v for v in vars(module).values() if isinstance(v, Agent)]
        if not agents:
            raise ConfigurationError(f"module {path!r} defines no Agent")
        return cls(agents)


NO_AGENTS = "no agents: set DORMANT_AGENTS to a module, e.g. myapp.agents"

AgentSource = AgentRegistry | Iterable[Agent] | str | None
"""Agents as a registry, a list, a module path (``"myapp.agents"``), or None for
``Settings.agents_module``."""


def load_agents(source: AgentSource, settings: Settings) -> AgentRegistry:
    if isinstance(source, AgentRegistry):
        return source
    if source is None:
        if not settings.agents_module:
            raise ConfigurationError(NO_AGENTS)
        return AgentRegistry.from_module(settings.agents_module)
    if isinstance(source, str):
        return AgentRegistry.from_module(source)
    return AgentRegistry(source)
