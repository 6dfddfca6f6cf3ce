"""``dormant approvals list|approve|reject|edit``: calls held for a person's decision
(``docs/approvals.md``), decided from a terminal.

A decision goes through the same client checks as every channel (``dormant/approvals.py``):
a refusal (already decided, a stale ``--digest``, an edit that fails the schema) is one
"error:" line and exit 1. Like the rest of the command, each imports the client only when
it runs.
"""

from __future__ import annotations

import getpass
import json
from typing import TYPE_CHECKING, Any

import typer

from dormant.cli.errors import reported
from dormant.cli.options import JsonOption, check_age

if TYPE_CHECKING:
    from dormant.approvals import PendingApproval
    from dormant.messages import ApprovalDecision

__all__ = ["approvals"]

approvals = typer.Typer(
    help="Tool calls held for a person's approval: list and decide them.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

_BY_HELP = "Who decides (recorded in the thread's history); default: your login name."
_DIGEST_HELP = (
    "The arguments' digest you saw (from `list`): refused if they are not the stored ones."
)
_AGENTS_HELP = "Module defining the agents (default DORMANT_AGENTS): an edit is checked here."


def _by(value: str | None) -> str:
    """``--by``, else the login name; a process with none (a container run as a uid that
    has no name, without ``USER``) is asked for ``--by``."""
    if value:
        return value
    try:
        return getpass.getuser()
    except (KeyError, OSError) as error:  # OSError from Python 3.13 on
        why = f"no login name to record as the decider ({error}): give --by NAME"
        raise typer.BadParameter(why, param_hint="--by") from None


def _record(p: PendingApproval) -> dict[str, Any]:
    return {
        "thread_id": p.thread_id,
        "root_id": p.root_id,
        "agent": p.agent,
        "call_id": p.call_id,
        "tool": p.tool,
        "args": p.args,
        "digest": p.digest,
        "decisions": list(p.decisions),
        "prompt": p.prompt,
        "requested_at": p.requested_at.isoformat(),
        "expires_at": p.expires_at.isoformat() if p.expires_at else None,
        "on_timeout": p.on_timeout,
        "code_version": p.code_version,
    }


@approvals.command("list")
@reported
def list_approvals(
    root: str | None = typer.Option(None, "--root", help="Only this root thread's tree."),
    agent: str | None = typer.Option(None, "--agent", help="Only this agent's threads."),
    older_than: str | None = typer.Option(
        None,
        "--older-than",
        help="Only those waiting longer than this (1h, 30m, 7d).",
        callback=check_age,
    ),
    limit: int = typer.Option(100, min=1, help="How many to list."),
    as_json: bool = JsonOption,
) -> None:
    """Calls waiting for a decision, oldest first, with their arguments and digest."""
    from dormant.cli.connect import open_client
    from dormant.ops.prune import parse_age

    age_s = parse_age(older_than).total_seconds() if older_than else None
    with open_client() as client:
        held = client.pending_approvals(root_id=root, agent=agent, older_than_s=age_s, limit=limit)
    if as_json:
        typer.echo(json.dumps([_record(p) for p in held], indent=2))
        return
    if not held:
        typer.echo("no calls await approval")
        return
    for p in held:
        expires = (
            f", expires {p.expires_at:%Y-%m-%d %H:%M} ({p.on_timeout})" if p.expires_at else ""
        )
        typer.echo(
            f"{p.thread_id} {p.call_id}  {p.tool}({json.dumps(p.args, sort_keys=True)})\n"
            f"    {p.prompt}\n"
            f"    agent {p.agent} version {p.code_version}, asked {p.requested_at:%Y-%m-%d %H:%M}"
            f"{expires}, digest {p.digest}, may: {', '.join(p.decisions)}"
        )


def _said(made: ApprovalDecision, thread_id: str) -> None:
    typer.echo(f"{made.decision} of call {made.call_id} of thread {thread_id} queued")


@approvals.command()
@reported
def approve(
    thread_id: str,
    call_id: str,
    by: str | None = typer.Option(None, "--by", help=_BY_HELP),
    digest: str | None = typer.Option(None, "--digest", help=_DIGEST_HELP),
    reason: str = typer.Option("", "--reason", help="Why (shown in the history)."),
) -> None:
    """Run the held call with its stored arguments."""
    from dormant.cli.connect import open_client

    decider = _by(by)
    with open_client() as client:
        made = client.approve(
            thread_id, call_id, by=decider, digest=digest, reason=reason, channel="cli"
        )
    _said(made, thread_id)


@approvals.command()
@reported
def reject(
    thread_id: str,
    call_id: str,
    by: str | None = typer.Option(None, "--by", help=_BY_HELP),
    digest: str | None = typer.Option(None, "--digest", help=_DIGEST_HELP),
    reason: str = typer.Option("", "--reason", help="Why: the model reads it."),
) -> None:
    """Answer the held call with an error naming you and your reason; it never runs."""
    from dormant.cli.connect import open_client

    decider = _by(by)
    with open_client() as client:
        made = client.reject(
            thread_id, call_id, by=decider, digest=digest, reason=reason, channel="cli"
        )
    _said(made, thread_id)


@approvals.command()
@reported
def edit(
    thread_id: str,
    call_id: str,
    args: str = typer.Argument(
        ..., help='All the new arguments, as a JSON object: \'{"order_id": "A-17", "amount": 90}\''
    ),
    by: str | None = typer.Option(None, "--by", help=_BY_HELP),
    digest: str | None = typer.Option(None, "--digest", help=_DIGEST_HELP),
    reason: str = typer.Option("", "--reason", help="Why (shown in the history)."),
    agents: str | None = typer.Option(None, "--agents", help=_AGENTS_HELP),
) -> None:
    """Run the held call with ARGS instead of the model's (checked against the tool's schema)."""
    from dormant.cli.connect import open_client

    try:
        new_args = json.loads(args)
    except ValueError as error:
        raise typer.BadParameter(f"not JSON: {error}", param_hint="ARGS") from error
    if not isinstance(new_args, dict):
        raise typer.BadParameter("must be a JSON object", param_hint="ARGS")
    decider = _by(by)
    with open_client(agents) as client:
        made = client.edit(
            thread_id, call_id, new_args, by=decider, digest=digest, reason=reason, channel="cli"
        )
    _said(made, thread_id)
