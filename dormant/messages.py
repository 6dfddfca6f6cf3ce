"""The stored types: history items, inbound messages and live events.

Each family is a discriminated union of frozen pydantic models tagged by ``kind`` and
serialised through one ``TypeAdapter``: the stored shape is the in-memory shape.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = [
    "EVENT_TOOL_NAME",
    "ApprovalDecision",
    "ApprovalRequest",
    "AssistantTurn",
    "ChildReport",
    "Chunk",
    "Event",
    "EventAdapter",
    "EventMessage",
    "EventShown",
    "Inbound",
    "InboundAdapter",
    "Item",
    "ItemAdapter",
    "ItemAdded",
    "ParentMessage",
    "Rejected",
    "StatusChanged",
    "Summary",
    "ToolCall",
    "ToolDispatched",
    "ToolResult",
    "ToolResultMessage",
    "Usage",
    "UserMessage",
    "UserText",
]

EVENT_TOOL_NAME = "receive_event__injected"
"""The reserved name of synthetic calls: never offered to the model, refused when it calls it."""


_DEFERRED = ConfigDict(defer_build=True)
"""Validators and serializers are built on first use, not at import (most of its cost)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class ToolCall(_Frozen):
    """One call the model asked for; ``call_id`` is stable and gets exactly one result."""

    call_id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class Usage(_Frozen):
    """Token counts of one completion; ``total_tokens`` includes cached prompt tokens."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


# History items --------------------------------------------------------------------------


class UserText(_Frozen):
    kind: Literal["user"] = "user"
    text: str


class AssistantTurn(_Frozen):
    """A complete model turn: its text and every tool call it asked for, in order."""

    kind: Literal["assistant"] = "assistant"
    text: str = ""
    calls: tuple[ToolCall, ...] = ()


class ToolResult(_Frozen):
    kind: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    content: str
    is_error: bool = False


class EventShown(_Frozen):
    """An event shown to the model: one row that expands to a synthetic call and its result.

    Stored as one row so a replay can never show the call without its result.
    """

    kind: Literal["event"] = "event"
    call_id: str
    original_call_id: str
    original_name: str
    original_args: dict[str, Any] = Field(default_factory=dict)
    content: str

    def as_call(self) -> ToolCall:
        """The synthetic ``receive_event__injected`` call, with the design's argument shape."""
        return ToolCall(
            call_id=self.call_id,
            name=EVENT_TOOL_NAME,
            args={
                "original_tool_name": self.original_name,
                "original_tool_call_id": self.original_call_id,
                "original_args": self.original_args,
            },
        )


class Summary(_Frozen):
    """A compaction summary standing for every item up to ``upto_seq``."""

    kind: Literal["summary"] = "summary"
    text: str
    upto_seq: int


class ApprovalRequest(_Frozen):
    """A call held for a person's decision (``runtime/approvals.py``): never dispatched
    until a decision approves it, never shown to the model (the audit trail's first half).

    ``digest`` is of the stored arguments: a decision must carry it, so what a person
    approved is what runs."""

    kind: Literal["approval_request"] = "approval_request"
    call_id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    digest: str
    decisions: tuple[str, ...] = ("approve", "reject", "edit")
    prompt: str = ""
    requested_at: datetime
    expires_at: datetime | None = None
    on_timeout: Literal["reject", "approve"] = "reject"
    code_version: str = ""
    """The version of the agent that proposed the call (``Agent.fingerprint``)."""


class ApprovalDecision(_Frozen):
    """A person's (or the timeout's) decision on a held call: an inbox message on the
    thread's ordered path, then the item that records it (who, when, from where, the
    digest they saw). ``args`` are the edited arguments of an ``edit``."""

    kind: Literal["approval_decision"] = "approval_decision"
    call_id: str
    decision: Literal["approve", "reject", "edit"]
    digest: str
    by: str
    channel: str = "python"
    reason: str = ""
    args: dict[str, Any] | None = None
    decided_at: datetime
    timed_out: bool = False


Item = Annotated[
    UserText
    | AssistantTurn
    | ToolResult
    | EventShown
    | Summary
    | ApprovalRequest
    | ApprovalDecision,
    Field(discriminator="kind"),
]
ItemAdapter: TypeAdapter[Item] = TypeAdapter(Item, config=_DEFERRED)


# Inbound messages -----------------------------------------------------------------------


class UserMessage(_Frozen):
    kind: Literal["user"] = "user"
    text: str


class ToolResultMessage(_Frozen):
    """A result for ``call_id``: the first one answers it, later ones may be events."""

    kind: Literal["result"] = "result"
    call_id: str
    content: str
    is_error: bool = False


class EventMessage(_Frozen):
    """A later message on a subscription call; ``final`` ends the subscription."""

    kind: Literal["event"] = "event"
    call_id: str
    content: str
    associative: bool = False
    final: bool = False


class ChildReport(_Frozen):
    """A child thread's report, routed to its parent's ``spawn_thread`` call."""

    kind: Literal["report"] = "report"
    call_id: str
    child_thread_id: str
    content: str
    final: bool = False
    """The child closed: its spawn call takes no more reports."""


class ParentMessage(_Frozen):
    """A parent's message to a child, shown on the child's inherited ``spawn_thread`` call."""

    kind: Literal["parent"] = "parent"
    call_id: str
    content: str


Inbound = Annotated[
    UserMessage | ToolResultMessage | EventMessage | ChildReport | ParentMessage | ApprovalDecision,
    Field(discriminator="kind"),
]
InboundAdapter: TypeAdapter[Inbound] = TypeAdapter(Inbound, config=_DEFERRED)


# Live events (for observers: CLI, Flower-side dashboards, tests) -----------------------


class Chunk(_Frozen):
    """A streamed piece of a completion: live only, never stored."""

    kind: Literal["chunk"] = "chunk"
    thread_id: str
    text: str
    attempt: str = ""
    """Which completion attempt streamed it: a new one means the last was abandoned."""


class ItemAdded(_Frozen):
    kind: Literal["item"] = "item"
    thread_id: str
    seq: int
    item: Item


class ToolDispatched(_Frozen):
    kind: Literal["dispatched"] = "dispatched"
    thread_id: str
    call_id: str
    name: str


class Rejected(_Frozen):
    """A message that was refused; nothing of it reached the history."""

    kind: Literal["rejected"] = "rejected"
    thread_id: str
    message_id: str
    reason: str


class StatusChanged(_Frozen):
    kind: Literal["status"] = "status"
    thread_id: str
    status: str
    detail: str = ""


Event = Annotated[
    Chunk | ItemAdded | ToolDispatched | Rejected | StatusChanged, Field(discriminator="kind")
]
EventAdapter: TypeAdapter[Event] = TypeAdapter(Event, config=_DEFERRED)
