"""What one run of an outbox row did: the tool task's result in Flower says which.

A tool task that ended without a crash did one of these; ``execute_outbox`` returns it and
``dormant.tool`` turns it into a short text (``docs/monitoring.md``). A plain "done" for
all of them hid a deferred tool still waiting for its callback and a tool that raised.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AlreadyAnswered",
    "Answered",
    "CancelHookRan",
    "NotHere",
    "Notified",
    "Raised",
    "Refused",
    "Started",
    "ToolOutcome",
]


@dataclass(frozen=True)
class Answered:
    """The call has its result: the tool returned, or sent its result while it ran."""


@dataclass(frozen=True)
class Started:
    """A deferred tool started its work and returned; its result comes later (its callback
    URL or ``send_result``)."""


@dataclass(frozen=True)
class Raised:
    """The tool raised, or is not installed on this worker; the error is the call's result."""

    error: str


@dataclass(frozen=True)
class AlreadyAnswered:
    """The call had its result before this run (a re-dispatch): the tool was not run again."""


@dataclass(frozen=True)
class Refused:
    """The thread refused the result for good (closed, subscription cancelled): dropped."""

    reason: str


@dataclass(frozen=True)
class NotHere:
    """This process lacks the call's tool (or agent) and another worker has it, or may
    soon (a rolling deploy): nothing ran and the row is left for a worker that has it."""

    why: str


@dataclass(frozen=True)
class CancelHookRan:
    """A cancelled subscription's cancel hook ran (``error`` if it raised), or there was none."""

    hook: bool
    error: str | None = None


@dataclass(frozen=True)
class Notified:
    """The agent's ``on_approval_requested`` hook ran for a held call (``error`` if it
    raised), or had nothing to do (``skipped``: decided meanwhile, or no hook)."""

    error: str | None = None
    skipped: bool = False


ToolOutcome = (
    Answered | Started | Raised | AlreadyAnswered | Refused | CancelHookRan | NotHere | Notified
)
