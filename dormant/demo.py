"""``dormant demo``: one agent that sleeps between every step, in one process, on SQLite.

It starts a build (a deferred tool), subscribes to pull requests (a subscription) and
goes idle; the build's callback and a "PR #42 opened" event wake it. Forged callbacks are
refused. Nothing needs a server, a network or an API key.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.rule import Rule
from rich.text import Text

from dormant.agents import Agent
from dormant.errors import MessageRejected, NotFound
from dormant.local import LocalSystem
from dormant.messages import Chunk, Event, EventShown, Item, StatusChanged, ToolResult, UserText
from dormant.models.base import Completion
from dormant.models.scripted import ScriptedModel, call, reply
from dormant.ops.timeline import render_event
from dormant.tools.base import ToolContext, tool

__all__ = ["run_demo"]

CI_CALLBACKS: dict[str, str] = {}
"""The fake CI service: build target -> the callback URL it will POST to when done."""


@tool(deferred=True)
def run_build(target: str, ctx: ToolContext) -> None:
    """Start a CI build of ``target``; the result arrives when the build finishes."""
    CI_CALLBACKS[target] = ctx.callback_url


@tool(subscription=True)
def watch_pull_requests(repo: str) -> str:
    """Subscribe to pull requests opened on ``repo``."""
    return f"Watching {repo} for new pull requests."


def triage_script(items: Sequence[Item]) -> Completion:
    """The scripted model: what a real model would plausibly say at each point."""
    last = items[-1]
    if isinstance(last, UserText):
        return reply(
            "I'll start the build and watch for pull requests meanwhile.",
            call("run_build", target="main"),
            call("watch_pull_requests", repo="acme/api"),
        )
    if isinstance(last, EventShown) and last.content.startswith("PR #"):
        # Inside the temporary thread that processes one pull-request event.
        return reply(
            "This one touches the CI configuration: worth telling the main thread.",
            call("report_to_parent", report=f"{last.content}; it changes the CI configuration"),
        )
    if isinstance(last, ToolResult) and last.name == "report_to_parent":
        return reply("", call("close_thread"))
    if isinstance(last, EventShown):
        return reply(
            f"Noted: {last.content.split(': ', 1)[-1]}. I'll review it now that main is green."
        )
    if isinstance(last, ToolResult) and last.name == "run_build":
        return reply(
            f"The build finished: {last.content}. Waiting for pull requests.",
            call("wait_for_event"),
        )
    return reply("Noted.")


TRIAGE = Agent(
    "triage",
    model=ScriptedModel(triage_script, name="scripted-triage"),
    instructions="You watch CI builds and pull requests for the acme/api team.",
    tools=[run_build, watch_pull_requests],
)


DEMO_DATABASE = Path("dormant-demo.db")
"""Where ``dormant demo`` keeps its database (in the current directory), for inspection."""


def run_demo(
    console: Console | None = None,
    database_path: Path | None = None,
    command: str | None = None,
) -> int:
    """Run the scenario on a fresh SQLite file and keep it; returns the number of slices run.

    ``database_path`` defaults to ``./dormant-demo.db``; a previous demo's file there is
    replaced. ``command`` is how the user runs dormant, for the inspection commands printed
    at the end (default: how this process was started).
    """
    console = console or Console()
    path = (database_path or DEMO_DATABASE).resolve()
    _remove_previous(path)
    url = f"sqlite:///{path}"
    with LocalSystem([TRIAGE], url) as system:
        started_s = time.monotonic()  # after imports and database set-up: the run only
        root: list[str] = []
        _show_live(system, console, root)
        console.print(Rule("1. a user asks; the agent starts a build and subscribes"))
        thread_id = "thr_demo"
        root.append(thread_id)
        system.launch("triage", "Build main, and tell me when a PR comes in.", thread_id=thread_id)
        system.run_until_idle()
        _idle(system, console, thread_id)

        console.print(Rule("2. refused: forged and misdirected callbacks"))
        url_of_build = CI_CALLBACKS["main"]
        _refused(
            console,
            "a callback whose token was altered",
            lambda: system.deliver_callback(url_of_build[:-4] + "AAAA", "green"),
        )
        watch_id = _call_id(system, thread_id, "watch_pull_requests")
        moved = url_of_build.replace(_call_id(system, thread_id, "run_build"), watch_id)
        _refused(
            console,
            "a token replayed against another call",
            lambda: system.deliver_callback(moved, "green"),
        )
        _refused(
            console,
            "a result for a call the agent never made",
            lambda: system.deliver(thread_id, "call_made_up", "green"),
        )

        console.print(Rule("3. twenty minutes later, CI calls back"))
        system.deliver_callback(
            url_of_build, "green, 1,204 tests passed", message_id="ci-build-main-1"
        )
        system.run_until_idle()
        _refused(
            console,
            "the same CI delivery again",
            lambda: system.deliver_callback(url_of_build, "green", message_id="ci-build-main-1"),
        )
        _idle(system, console, thread_id)

        console.print(Rule("4. tomorrow, a pull request is opened: a temporary thread looks at it"))
        system.send_event(
            thread_id,
            watch_id,
            "PR #42 opened by dana: 'Retry flaky DB tests'",
            message_id="gh-delivery-42",
        )
        system.run_until_idle()
        took_s = time.monotonic() - started_s
        _idle(system, console, thread_id)

        console.print(Rule("result"))
        console.print(f"slices run: [bold]{system.slices_run}[/]")
        console.print(
            f"stored size of the idle agent: [bold]{stored_bytes(system, thread_id):,} bytes[/]"
        )
        console.print(
            f"the four steps took {took_s:.2f} s (start-up and database set-up not counted); "
            "no server, no network, no API key"
        )
        slices = system.slices_run
    _print_inspection(console, command or invoked_as(), url, thread_id)
    return slices


def invoked_as() -> str:
    """How to run ``dormant`` again the way this process was run, as a shell word."""
    started = sys.argv[0] if sys.argv else ""
    if Path(started).name == "dormant":
        return shlex.quote(started)
    return f"{shlex.quote(sys.executable)} -m dormant"


def _remove_previous(path: Path) -> None:
    """Remove a previous demo's database, its SQLite side files and its signing key."""
    for suffix in ("", "-journal", "-wal", "-shm", ".key"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


def _print_inspection(console: Console, command: str, url: str, thread_id: str) -> None:
    console.print(Rule("look inside"))
    console.print(f"The demo's database is kept in {url.removeprefix('sqlite:///')}. Inspect it:")
    for args in ("threads", f"show {thread_id}", f"show {thread_id} --full"):
        # soft_wrap: a long path must stay on one line, ready to copy.
        line = f"  {command} {args} --database-url {shlex.quote(url)}"
        console.print(Text(line), soft_wrap=True)


def stored_bytes(system: LocalSystem, thread_id: str) -> int:
    """The serialized size of what the store keeps for the thread: items, calls, thread row."""
    snap = system.store.load(thread_id)
    items = sum(len(s.item.model_dump_json()) + len(s.message_id) for s in snap.items)
    calls = sum(len(c.call_id) + len(c.name) + len(str(c.args)) + 16 for c in snap.calls.values())
    return items + calls + len(repr(snap.thread))


def _show_live(system: LocalSystem, console: Console, root: list[str]) -> None:
    def listener(event: Event) -> None:
        if isinstance(event, Chunk | StatusChanged):
            return
        line = render_event(event)
        if line is None:
            return
        if root and event.thread_id != root[0]:
            line = Text.assemble(("  ↳ event thread ", "blue"), line)
        console.print(line)

    system.on_event(listener)


def _idle(system: LocalSystem, console: Console, thread_id: str) -> None:
    info = system.thread(thread_id)
    pending = [c.name for c in system.store.load(thread_id).calls.values() if c.state == "pending"]
    waiting = f", waiting on {', '.join(pending)}" if pending else ""
    console.print(
        f"[dim]      → thread {thread_id} is {info.status}{waiting}: no process, task or "
        "connection is held while it waits[/]"
    )


def _refused(console: Console, what: str, action: object) -> None:
    try:
        action()  # type: ignore[operator]
    except (MessageRejected, NotFound) as error:
        console.print(f"[bold red]      refused[/] {what}: {error}")
    else:
        raise AssertionError(f"{what} was accepted")


def _call_id(system: LocalSystem, thread_id: str, name: str) -> str:
    return next(c.call_id for c in system.store.load(thread_id).calls.values() if c.name == name)
