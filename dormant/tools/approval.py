"""Declaring that a tool call needs a person's approval: ``Approval``, and the digest that
binds a decision to the exact arguments a person saw.

A tool declares it (``@tool(approval=True)`` or ``@tool(approval=Approval(...))``); an agent
declares it for tools that are not its own code, by name pattern
(``Agent(approval={"github.*": True})``). The mechanics live in ``runtime/approvals.py``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dormant.errors import ConfigurationError

__all__ = [
    "DECISIONS",
    "Approval",
    "ApprovalContext",
    "ApprovalRule",
    "args_digest",
    "policy_for",
    "resolve_rule",
]

DECISIONS = ("approve", "reject", "edit")
"""Every decision a person can make; a policy may allow fewer."""


@dataclass(frozen=True)
class ApprovalContext:
    """What ``Approval.when`` knows of the call besides its arguments."""

    thread_id: str
    agent: str
    tool: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Approval:
    """When a call needs approval, what a person may decide, and what a timeout decides.

    ``when(args, ctx)`` returning False lets the call run at once (a refund under 100 €);
    None asks every time. ``timeout_s`` (None: never) ends the wait with ``on_timeout``,
    fired once by a durable timer. ``prompt`` is formatted with the call's arguments
    ("Refund {amount} to {order_id}?") for the person who decides.
    """

    when: Callable[[dict[str, Any], ApprovalContext], bool] | None = None
    decisions: tuple[str, ...] = DECISIONS
    timeout_s: float | None = None
    on_timeout: Literal["reject", "approve"] = "reject"
    prompt: str = ""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.decisions) - set(DECISIONS))
        if unknown or not self.decisions:
            raise ConfigurationError(f"approval decisions must be among {DECISIONS}: {unknown}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigurationError("approval timeout_s must be positive")
        if self.on_timeout not in ("reject", "approve"):
            raise ConfigurationError("approval on_timeout must be 'reject' or 'approve'")

    def applies(self, args: dict[str, Any], ctx: ApprovalContext) -> bool:
        return self.when is None or bool(self.when(args, ctx))

    def prompt_for(
        self, name: str, args: dict[str, Any], defaults: Mapping[str, Any] | None = None
    ) -> str:
        """The prompt with the arguments filled in (``defaults``, the tool's, for those the
        model left out); a template that does not fit them is shown as written rather
        than failing the slice."""
        if not self.prompt:
            return f"Run {name} with {json.dumps(args, sort_keys=True, default=str)}?"
        try:
            return self.prompt.format(**{**(defaults or {}), **args})
        except (KeyError, IndexError, ValueError, AttributeError):
            return self.prompt


ApprovalRule = bool | Approval | None
"""How a tool or an agent's pattern declares approval: True (ask, with the defaults), an
``Approval`` policy, or False/None (never ask)."""


def resolve_rule(rule: ApprovalRule) -> Approval | None:
    if rule is True:
        return Approval()
    if isinstance(rule, Approval):
        return rule
    return None


def policy_for(
    tool_name: str, tool_rule: ApprovalRule, agent_rules: Mapping[str, ApprovalRule]
) -> Approval | None:
    """The policy of a call to ``tool_name``: the tool's own declaration, else the first of
    the agent's patterns (``fnmatch``, ``"github.*"``) that matches its name."""
    own = resolve_rule(tool_rule)
    if own is not None or tool_rule is False:
        return own
    for pattern, rule in agent_rules.items():
        if fnmatch.fnmatchcase(tool_name, pattern):
            return resolve_rule(rule)
    return None


def args_digest(name: str, args: dict[str, Any]) -> str:
    """32 hex digits of SHA-256 over the call's canonical JSON (sorted keys, no spaces): the
    same arguments give the same digest in any process and any version."""
    text = json.dumps(
        {"name": name, "args": args},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]
