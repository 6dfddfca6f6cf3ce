"""Human approval of tool calls, the deciding side: what is pending, and the checks a
decision passes before it is queued (``docs/approvals.md``).

Every channel (Python, the command line, HTTP, signed links, the dashboard) decides through
``BaseClient.approve`` / ``reject`` / ``edit``, which build the decision here. The checks
answer the person at once (unknown call, not awaiting approval, already decided, a digest
that is not the stored arguments', a decision the policy does not allow, an edit that fails
the tool's schema); the inbox's unique key on the call's one decision id makes the first
decision win even between two processes, and the slice applies it in the thread's order
(``runtime/approvals.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from dormant.agents import AgentRegistry
from dormant.errors import (
    AlreadyDecided,
    CallAnswered,
    DecisionNotAllowed,
    DigestMismatch,
    DuplicateMessage,
    InvalidEdit,
    NotAwaitingApproval,
    UnknownAgent,
)
from dormant.http.tokens import approval_link
from dormant.messages import ApprovalDecision, ApprovalRequest, Inbound
from dormant.runtime.approvals import DECISION_PREFIX, decision_id, request_id
from dormant.settings import Settings
from dormant.stores.base import (
    CallRecord,
    CallState,
    Priority,
    QueryStore,
    Store,
    ThreadInfo,
    ThreadStatus,
)
from dormant.tools.approval import Approval, ApprovalContext
from dormant.tools.outcomes import Notified

__all__ = [
    "Approval",
    "ApprovalContext",
    "ApprovalMethods",
    "PendingApproval",
    "build_decision",
    "find_request",
    "notify_requested",
    "pending",
]

Decision = Literal["approve", "reject", "edit"]

log = logging.getLogger("dormant.approvals")


@dataclass(frozen=True)
class PendingApproval:
    """A call held for a decision: what a person needs to decide it, and where it is."""

    thread_id: str
    root_id: str
    agent: str
    call_id: str
    tool: str
    args: dict[str, Any]
    digest: str
    """Of the stored arguments: a decision carries it back, so what was seen is what runs."""
    decisions: tuple[str, ...]
    prompt: str
    requested_at: datetime
    expires_at: datetime | None
    on_timeout: str
    code_version: str
    """The version of the agent that proposed the call."""

    def age_s(self, now: datetime) -> float:
        return (now - self.requested_at).total_seconds()


def pending(
    store: QueryStore,
    *,
    root_id: str | None = None,
    agent: str | None = None,
    older_than_s: float | None = None,
    now: datetime,
    limit: int = 100,
) -> list[PendingApproval]:
    """Open approvals, oldest first: of a whole tree (``root_id``: a child's show on its
    root), of one agent, or asked more than ``older_than_s`` ago."""
    found: list[PendingApproval] = []
    for timer in store.unfired_timers(DECISION_PREFIX, root_id=root_id, agent=agent, limit=limit):
        thread = store.thread(timer.thread_id)
        request = find_request(store, timer.thread_id, timer.call_id)
        if request is None or store.call(thread.id, timer.call_id).state is not CallState.PENDING:
            continue
        if _queued(store, thread.id, timer.call_id) is not None:
            continue  # decided; the thread has not applied it yet
        held = _pending(thread, request)
        if older_than_s is None or held.age_s(now) >= older_than_s:
            found.append(held)
    return sorted(found, key=lambda p: p.requested_at)


def _pending(thread: ThreadInfo, request: ApprovalRequest) -> PendingApproval:
    return PendingApproval(
        thread_id=thread.id,
        root_id=thread.root_id,
        agent=thread.agent,
        call_id=request.call_id,
        tool=request.name,
        args=request.args,
        digest=request.digest,
        decisions=request.decisions,
        prompt=request.prompt,
        requested_at=request.requested_at,
        expires_at=request.expires_at,
        on_timeout=request.on_timeout,
        code_version=request.code_version,
    )


def notify_requested(
    store: QueryStore, agents: AgentRegistry, thread: ThreadInfo, call: CallRecord
) -> Notified:
    """Run the agent's ``on_approval_requested`` for a held call (a "notify" outbox row);
    nothing once the call was decided or the hook is gone."""
    try:
        hook = agents.get_agent(thread.agent).on_approval_requested
    except UnknownAgent:
        hook = None
    request = find_request(store, thread.id, call.call_id)
    open_ = call.state is CallState.PENDING and _decided(store, thread.id, call.call_id) is None
    if hook is None or request is None or not open_:
        return Notified(skipped=True)
    try:
        hook(_pending(thread, request))
    except Exception as error:
        log.exception(
            "on_approval_requested failed for call %s of thread %s", call.call_id, thread.id
        )
        return Notified(f"{type(error).__name__}: {error}")
    return Notified()


def find_request(store: QueryStore, thread_id: str, call_id: str) -> ApprovalRequest | None:
    wanted = request_id(call_id)
    for stored in store.own_items(thread_id):
        if stored.message_id == wanted and isinstance(stored.item, ApprovalRequest):
            return stored.item
    return None


def _decided(store: QueryStore, thread_id: str, call_id: str) -> str | None:
    """What was decided on the call already (a queued decision counts), or None."""
    wanted = decision_id(call_id)
    for stored in store.own_items(thread_id):
        if stored.message_id == wanted and isinstance(stored.item, ApprovalDecision):
            return f"{stored.item.decision} by {stored.item.by}"
    return _queued(store, thread_id, call_id)


def _queued(store: QueryStore, thread_id: str, call_id: str) -> str | None:
    """The decision on the call that waits in the thread's inbox, if one does."""
    wanted = decision_id(call_id)
    for row in store.inbox(thread_id):
        if row.message_id == wanted and isinstance(row.message, ApprovalDecision):
            return f"{row.message.decision} by {row.message.by}"
    return None


def _settled(store: QueryStore, thread_id: str, call: CallRecord) -> str:
    """How a call nobody decided on stopped waiting: its thread's close, or its state."""
    thread = store.thread(thread_id)
    if thread.status is ThreadStatus.CLOSED:
        why = f": {thread.closed_reason}" if thread.closed_reason else ""
        return f"the thread was closed first{why}"
    return f"the call is {call.state.value}"


def build_decision(
    store: QueryStore,
    agents: AgentRegistry | None,
    thread_id: str,
    call_id: str,
    decision: Decision,
    *,
    by: str,
    now: datetime,
    digest: str | None = None,
    reason: str = "",
    args: dict[str, Any] | None = None,
    channel: str = "python",
) -> ApprovalDecision:
    """The decision to queue, once every check passed; raises ``UnknownThread``,
    ``UnknownCall`` or a ``DecisionRefused``. ``digest`` None trusts the caller to decide
    on the stored arguments (in-process code); every other channel passes the one shown."""
    call = store.call(thread_id, call_id)
    request = find_request(store, thread_id, call_id)
    if request is None:
        raise NotAwaitingApproval(thread_id, call_id)
    made = _decided(store, thread_id, call_id)
    if made is not None:
        raise AlreadyDecided(thread_id, call_id, made)
    if call.state is not CallState.PENDING:
        raise AlreadyDecided(thread_id, call_id, _settled(store, thread_id, call))
    if digest is not None and digest != request.digest:
        raise DigestMismatch(thread_id, call_id, digest, request.digest)
    if decision not in request.decisions:
        raise DecisionNotAllowed(thread_id, call_id, decision, request.decisions)
    if decision == "edit":
        if args is None:
            raise InvalidEdit(thread_id, call_id, "an edit needs the new arguments")
        _check_edit(store, agents, thread_id, call.name, call_id, args)
    return ApprovalDecision(
        call_id=call_id,
        decision=decision,
        digest=request.digest,
        by=by,
        channel=channel,
        reason=reason,
        args=args if decision == "edit" else None,
        decided_at=now,
    )


def _check_edit(
    store: QueryStore,
    agents: AgentRegistry | None,
    thread_id: str,
    tool_name: str,
    call_id: str,
    args: dict[str, Any],
) -> None:
    """Refuse edited arguments that fail the tool's schema, where the agent is known here
    (a client without the agents' code leaves it to the slice, which answers the call with
    the reason instead of running it)."""
    if agents is None:
        return
    try:
        agent = agents.get_agent(store.thread(thread_id).agent)
    except UnknownAgent:
        return
    tool = agent.tool(tool_name)
    error = None if tool is None else tool.error_for(args)
    if error is not None:
        raise InvalidEdit(thread_id, call_id, error.removeprefix("Error: "))


class ApprovalMethods:
    """``pending_approvals``, ``approve``, ``reject`` and ``edit``, mixed into
    ``BaseClient`` (so ``Client`` and ``LocalSystem`` share them)."""

    store: Store
    agents: AgentRegistry | None
    settings: Settings

    def _enqueue(
        self,
        thread_id: str,
        message_id: str | None,
        message: Inbound,
        priority: int,
        *,
        limited: bool = False,
        answered_ok: bool = True,
    ) -> str:
        raise NotImplementedError

    def pending_approvals(
        self,
        *,
        root_id: str | None = None,
        agent: str | None = None,
        older_than_s: float | None = None,
        now: datetime | None = None,
        limit: int = 100,
    ) -> list[PendingApproval]:
        """Calls held for a decision, oldest first: across a whole tree (``root_id``), of
        one agent, or waiting longer than ``older_than_s`` at ``now`` (default: now)."""
        now = now or datetime.now(UTC)
        return pending(
            self.store,
            root_id=root_id,
            agent=agent,
            older_than_s=older_than_s,
            now=now,
            limit=limit,
        )

    def approval_links(
        self, thread_id: str, call_id: str, *, by: str, ttl_s: float = 7 * 86_400.0
    ) -> dict[str, str]:
        """One-click links (``dormant serve``) that approve or reject the held call as
        ``by``, for email or chat: each signed for that call, decision, person and the
        stored arguments' digest, valid ``ttl_s``. A GET shows a confirmation page; only
        its button (a POST) decides."""
        request = find_request(self.store, thread_id, call_id)
        if request is None:
            self.store.call(thread_id, call_id)  # ``UnknownCall`` first, if it is that
            raise NotAwaitingApproval(thread_id, call_id)
        expires_at_s = int(time.time() + ttl_s)
        return {
            decision: approval_link(
                self.settings.callback_base_url,
                self.settings.secret_keys,
                thread_id,
                call_id,
                decision,
                request.digest,
                by,
                expires_at_s,
            )
            for decision in ("approve", "reject")
            if decision in request.decisions
        }

    def approve(
        self,
        thread_id: str,
        call_id: str,
        *,
        by: str,
        digest: str | None = None,
        reason: str = "",
        channel: str = "python",
    ) -> ApprovalDecision:
        """Run the held call with its stored arguments. Raises ``DecisionRefused`` (already
        decided, a digest that is not the stored arguments', ...), ``UnknownCall``."""
        return self._decide(thread_id, call_id, "approve", by, digest, reason, None, channel)

    def reject(
        self,
        thread_id: str,
        call_id: str,
        *,
        by: str,
        reason: str = "",
        digest: str | None = None,
        channel: str = "python",
    ) -> ApprovalDecision:
        """Answer the held call with an error result naming ``by`` and ``reason``; the
        tool never runs."""
        return self._decide(thread_id, call_id, "reject", by, digest, reason, None, channel)

    def edit(
        self,
        thread_id: str,
        call_id: str,
        args: dict[str, Any],
        *,
        by: str,
        reason: str = "",
        digest: str | None = None,
        channel: str = "python",
    ) -> ApprovalDecision:
        """Run the held call with ``args`` instead (checked against the tool's schema:
        ``InvalidEdit`` says why); its result tells the model the arguments changed."""
        return self._decide(thread_id, call_id, "edit", by, digest, reason, args, channel)

    def _decide(
        self,
        thread_id: str,
        call_id: str,
        decision: Decision,
        by: str,
        digest: str | None,
        reason: str,
        args: dict[str, Any] | None,
        channel: str,
    ) -> ApprovalDecision:
        made = build_decision(
            self.store,
            self.agents,
            thread_id,
            call_id,
            decision,
            by=by,
            now=datetime.now(UTC),
            digest=digest,
            reason=reason,
            args=args,
            channel=channel,
        )
        try:  # a person is waiting for the outcome: the thread's urgent queue
            self._enqueue(
                thread_id, decision_id(call_id), made, Priority.INTERACTIVE, answered_ok=False
            )
        except (DuplicateMessage, CallAnswered) as error:
            # Another decision (or the timeout) got in first, between the checks and here.
            raise AlreadyDecided(
                thread_id, call_id, _decided(self.store, thread_id, call_id) or ""
            ) from error
        return made
