"""Human approval of tool calls, the slice's side (``docs/approvals.md``).

A call whose tool (or the agent's name pattern) asks for approval is recorded pending like
any call, but instead of an outbox row the turn stores an ``ApprovalRequest`` item (the
arguments, their digest, the decisions allowed, the expiry) and a durable timer that
carries the timeout's decision. Nothing runs while it waits. A decision is an inbox message
under the call's one decision id (``decision_id``): the inbox's unique key makes the first
decision win, the timer's included (a timer whose id was taken is ignored when it fires).
The slice applies it in inbox order like any message (``ApprovalDesk.decide``): approve
dispatches the call with its stored arguments, edit with the person's (checked against the
tool's schema), reject answers the call with an error result the model reads. The model
runs again only once every call of its turn has a result, as always.

Open approvals are the unfired timers under a decision id: a decision, an interruption
or a close deletes the timer (``Turn.cancel_timers``), so the store lists them without
any table of its own. An approval with no timeout gets a timer due at ``NEVER``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dormant.agents import Agent
from dormant.messages import ApprovalDecision, ApprovalRequest, ToolCall, ToolResult
from dormant.runtime.history import Applied, has_pending
from dormant.runtime.turn import Turn
from dormant.stores.base import CallState, InboxRow, NewTimer, Snapshot, ThreadInfo
from dormant.stores.rawitem import item_kind
from dormant.tools.approval import ApprovalContext, args_digest, policy_for
from dormant.tools.base import Tool

__all__ = [
    "DECISION_PREFIX",
    "NEVER",
    "ApprovalDesk",
    "ask_approval",
    "decision_id",
    "rejection_text",
    "request_id",
]

DECISION_PREFIX = "approval:"
NEVER = datetime(9999, 12, 31, tzinfo=UTC)
"""The due time of the timer of an approval that never times out (it lists it as open)."""


def decision_id(call_id: str) -> str:
    """The one message id every decision on ``call_id`` takes: the first one wins."""
    return f"{DECISION_PREFIX}{call_id}"


def request_id(call_id: str) -> str:
    """The message id of the request's item (unique in the thread, as every item's)."""
    return f"{call_id}:approval"


def _defaults(tool: Tool) -> dict[str, Any]:
    """The tool's arguments that have a default, with it: what a call that leaves them
    out runs with, so its prompt can show them."""
    fields = tool.arguments.model_fields
    return {
        key: spec.get_default(call_default_factory=True)
        for key, spec in fields.items()
        if not spec.is_required()
    }


def ask_approval(
    agent: Agent,
    tool: Tool,
    call: ToolCall,
    thread: ThreadInfo,
    turn: Turn,
    applied: Applied,
    now: datetime,
) -> bool:
    """Hold ``call`` for a decision if its policy asks for one: the request item and its
    timer join the turn. False when the call may run at once."""
    policy = policy_for(call.name, tool.approval, agent.approval)
    if policy is None:
        return False
    if not policy.applies(
        call.args, ApprovalContext(thread.id, agent.name, call.name, thread.metadata)
    ):
        return False
    digest = args_digest(call.name, call.args)
    expires_at = None if policy.timeout_s is None else now + timedelta(seconds=policy.timeout_s)
    request = ApprovalRequest(
        call_id=call.call_id,
        name=call.name,
        args=call.args,
        digest=digest,
        decisions=policy.decisions,
        prompt=policy.prompt_for(call.name, call.args, _defaults(tool)),
        requested_at=now,
        expires_at=expires_at,
        on_timeout=policy.on_timeout,
        code_version=turn.code_version,
    )
    turn.add(request_id(call.call_id), request)
    timeout = ApprovalDecision(
        call_id=call.call_id,
        decision=policy.on_timeout,
        digest=digest,
        by="timeout",
        channel="timer",
        reason=f"no decision within {policy.timeout_s:g} s" if policy.timeout_s else "",
        decided_at=expires_at or NEVER,
        timed_out=True,
    )
    turn.timers.append(
        NewTimer(call.call_id, expires_at or NEVER, decision_id(call.call_id), timeout)
    )
    applied.awaiting.add(call.call_id)
    if agent.on_approval_requested is not None:  # run off the slice, at least once
        turn.outbox.append((call.call_id, "notify"))
    return True


def rejection_text(decision: ApprovalDecision) -> str:
    """The error result a rejected call gets: the model reads who rejected it and why."""
    if decision.timed_out:
        why = f" ({decision.reason})" if decision.reason else ""
        return f"Error: the call was not approved in time{why}; the tool was not run."
    why = f": {decision.reason}" if decision.reason else ""
    return f"Error: the call was rejected by {decision.by}{why}. The tool was not run."


@dataclass
class ApprovalDesk:
    """The thread's open approvals while a slice applies its inbox."""

    agent: Agent
    turn: Turn
    requests: dict[str, ApprovalRequest] = field(default_factory=dict)
    """Open requests by call id: asked, not decided, the call still pending."""
    edits: dict[str, ApprovalDecision] = field(default_factory=dict)
    """Edit decisions in the history by call id: their results say the arguments changed."""
    _opened: set[str] = field(default_factory=set)

    @classmethod
    def open(cls, agent: Agent, snap: Snapshot, turn: Turn) -> ApprovalDesk:
        """The open requests and past edits, read from the history only when a call is
        pending (held, or approved and running): a thread woken from idle skips the scan."""
        if not has_pending(snap.calls):
            return cls(agent, turn)
        requests: dict[str, ApprovalRequest] = {}
        decided: dict[str, ApprovalDecision] = {}
        for stored in snap.items:
            kind = item_kind(stored)  # a raw item is decoded only if it is an approval's
            if kind == "approval_request":
                item = stored.item
                assert isinstance(item, ApprovalRequest)
                requests[item.call_id] = item
            elif kind == "approval_decision":
                made = stored.item
                assert isinstance(made, ApprovalDecision)
                decided[made.call_id] = made
        pending = {
            cid: r
            for cid, r in requests.items()
            if cid not in decided
            and cid in snap.calls
            and snap.calls[cid].state is CallState.PENDING
        }
        edits = {cid: d for cid, d in decided.items() if d.decision == "edit"}
        return cls(agent, turn, pending, edits, set(pending))

    def decide(self, row: InboxRow, decision: ApprovalDecision, out: Applied) -> None:
        """Apply one decision row (``apply_inbox`` calls it in inbox order)."""
        call = out.calls.get(decision.call_id)
        request = self.requests.get(decision.call_id)
        if call is None:
            out.rejected.append(
                (row, f"thread {row.thread_id!r} never made call {decision.call_id!r}")
            )
            return
        if request is None or call.state is not CallState.PENDING:
            if decision.timed_out:
                out.done.append(row.id)  # the timeout of a call settled otherwise: no news
                return
            why = "already decided" if request is None else f"the call is {call.state.value}"
            out.rejected.append((row, f"call {call.call_id!r} does not await approval ({why})"))
            return
        if decision.digest != request.digest:
            out.rejected.append(
                (row, f"digest {decision.digest!r} does not match the stored arguments'")
            )
            return
        if not decision.timed_out and decision.decision not in request.decisions:
            out.rejected.append((row, f"decision {decision.decision!r} is not allowed"))
            return
        del self.requests[call.call_id]
        out.items.append((row.message_id, decision))
        out.done.append(row.id)
        if decision.decision == "reject":
            self._answer(out, call.call_id, rejection_text(decision))
            return
        if decision.decision == "edit":
            tool = self.agent.tool(call.name)
            args = decision.args if decision.args is not None else {}
            error = "no tool to check them against" if tool is None else tool.error_for(args)
            if error is not None:  # a client that could not check it (it lacks the agent)
                self._answer(
                    out,
                    call.call_id,
                    f"Error: the arguments {decision.by} edited were refused ({error}); "
                    "the tool was not run.",
                )
                return
            out.calls[call.call_id] = replace(call, args=args)
            out.changed.add(call.call_id)
            self.edits[call.call_id] = decision
        self.turn.outbox.append((call.call_id, "tool"))

    def _answer(self, out: Applied, call_id: str, content: str) -> None:
        call = out.calls[call_id]
        out.set_state(call, CallState.ANSWERED)
        out.items.append(
            (
                f"{call_id}:decided",
                ToolResult(call_id=call_id, name=call.name, content=content, is_error=True),
            )
        )
        out.woke = True

    def settle(self, out: Applied) -> None:
        """After the inbox is applied: which calls still await a decision (the status says
        so), the timers of those that no longer do deleted (decided, interrupted), and
        each result of an edited call marked so the model knows what ran."""
        out.awaiting = {cid for cid in self.requests if out.calls[cid].state is CallState.PENDING}
        self.turn.cancel_timers += sorted(self._opened - out.awaiting)
        for index, (message_id, item) in enumerate(out.items):
            if isinstance(item, ToolResult) and item.call_id in self.edits:
                edit = self.edits[item.call_id]
                args = json.dumps(edit.args, sort_keys=True, default=str)
                note = f"[arguments changed by {edit.by} before the call ran: {args}] "
                out.items[index] = (
                    message_id,
                    item.model_copy(update={"content": note + item.content}),
                )
