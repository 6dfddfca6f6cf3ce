"""The dashboard's approval queue: every call held for a decision, oldest first, with its
arguments, and (actions enabled, CSRF checked) approve, reject and edit forms.

A decision from here goes through the client's checks like every channel
(``channel="dashboard"``), carrying the digest of the arguments the page showed: a page
left open while another channel decided is refused, not applied.
"""

from __future__ import annotations

import json
from datetime import datetime

from dormant.approvals import PendingApproval
from dormant.base_client import BaseClient
from dormant.errors import MalformedMessage
from dormant.http.ui.html import ago, esc, href, json_block

__all__ = ["approvals_body", "decide_from_form"]


def approvals_body(
    client: BaseClient,
    *,
    root: str,
    now: datetime,
    csrf: str | None,
    root_id: str | None = None,
    agent: str | None = None,
    notice: str = "",
) -> str:
    """The queue; ``csrf`` None: read-only (no forms)."""
    held = client.pending_approvals(root_id=root_id, agent=agent, limit=200)
    cards = "".join(_card(p, root, now, csrf) for p in held) or (
        '<p class="empty">No calls await approval.</p>'
    )
    scope = f" in the tree of {esc(root_id)}" if root_id else ""
    scope += f" of agent {esc(agent)}" if agent else ""
    alert = f'<p class="alert">{esc(notice)}</p>' if notice else ""
    return f'<h1>Approvals{scope}</h1>{alert}<section class="approvals">{cards}</section>'


def _card(p: PendingApproval, root: str, now: datetime, csrf: str | None) -> str:
    thread = href(root, "thread", id=p.thread_id)
    expires = f", {_until(p.expires_at, now)}: then {esc(p.on_timeout)}" if p.expires_at else ""
    facts = (
        f'<p class="muted">thread <a href="{thread}"><code>{esc(p.thread_id)}</code></a>'
        f" (root <code>{esc(p.root_id)}</code>), agent {esc(p.agent)} version "
        f"<code>{esc(p.code_version)}</code>, asked {ago(p.requested_at, now)}{expires}, "
        f"digest <code>{esc(p.digest)}</code></p>"
    )
    forms = "" if csrf is None else _forms(p, root, csrf)
    return (
        f'<article class="approval" data-call="{esc(p.call_id)}">'
        f"<h2>{esc(p.tool)} <code>{esc(p.call_id)}</code></h2>"
        f"<p>{esc(p.prompt)}</p>{json_block(p.args)}{facts}{forms}</article>"
    )


def _forms(p: PendingApproval, root: str, csrf: str) -> str:
    hidden = (
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        f'<input type="hidden" name="thread" value="{esc(p.thread_id)}">'
        f'<input type="hidden" name="call" value="{esc(p.call_id)}">'
        f'<input type="hidden" name="digest" value="{esc(p.digest)}">'
    )
    action = esc(f"{root}approvals/decide")
    who = '<input name="by" placeholder="your name" required>'
    forms = []
    if "approve" in p.decisions:
        forms.append(
            f'<form method="post" action="{action}">{hidden}'
            f'<input type="hidden" name="decision" value="approve">{who}'
            '<button class="act approve" type="submit">approve</button></form>'
        )
    if "reject" in p.decisions:
        forms.append(
            f'<form method="post" action="{action}">{hidden}'
            f'<input type="hidden" name="decision" value="reject">{who}'
            '<input name="reason" placeholder="why (the agent reads it)">'
            '<button class="act reject" type="submit">reject</button></form>'
        )
    if "edit" in p.decisions:
        args = esc(json.dumps(p.args, indent=2, sort_keys=True))
        forms.append(
            f'<form class="edit" method="post" action="{action}">{hidden}'
            f'<input type="hidden" name="decision" value="edit">{who}'
            f'<textarea name="args" rows="4" cols="60">{args}</textarea>'
            '<button class="act edit" type="submit">run with these arguments</button></form>'
        )
    return f'<div class="actions">{"".join(forms)}</div>'


def _until(when: datetime, now: datetime) -> str:
    """``times out in 59 min`` (or ``timed out``), the exact UTC time as the tooltip."""
    seconds = int((when - now).total_seconds())
    if seconds <= 0:
        text = "timed out"
    elif seconds < 3600:
        text = f"times out in {max(1, seconds // 60)} min"
    elif seconds < 2 * 86_400:
        text = f"times out in {seconds // 3600} h"
    else:
        text = f"times out in {seconds // 86_400} days"
    return f'<span title="{esc(when.isoformat(timespec="seconds"))}">{text}</span>'


def decide_from_form(client: BaseClient, form: dict[str, str]) -> str:
    """Take the decision a queue form posted; the thread id it concerns. Raises
    ``DecisionRefused`` (shown on the queue) or ``MalformedMessage``."""
    thread_id, call_id = form.get("thread", ""), form.get("call", "")
    decision, digest = form.get("decision", ""), form.get("digest", "")
    by = form.get("by", "").strip() or "dashboard"
    reason = form.get("reason", "").strip()
    if not thread_id or not call_id or not digest:
        raise MalformedMessage("the form lacks the thread, the call or the digest")
    if decision == "approve":
        client.approve(thread_id, call_id, by=by, digest=digest, channel="dashboard")
    elif decision == "reject":
        client.reject(thread_id, call_id, by=by, reason=reason, digest=digest, channel="dashboard")
    elif decision == "edit":
        try:
            args = json.loads(form.get("args", ""))
        except ValueError as error:
            raise MalformedMessage(f"the edited arguments are not JSON: {error}") from error
        if not isinstance(args, dict):
            raise MalformedMessage("the edited arguments must be a JSON object")
        client.edit(thread_id, call_id, args, by=by, digest=digest, channel="dashboard")
    else:
        raise MalformedMessage(f"not a decision: {decision!r}")
    return thread_id
