"""The ``dormant`` command.

Each command imports what it needs when it runs, so ``dormant --help`` loads no database,
Celery or model code. Every command is wrapped in ``reported`` (``errors.py``): a
failure is one line on stderr and a documented exit code. ``run_hosted`` runs the same
commands with a host framework's settings (``python manage.py dormant``, ``flask dormant``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from typing import TYPE_CHECKING, Any

import typer

from dormant.cli.approvals import approvals
from dormant.cli.connect import (
    check_sqlite_directory,
    checked_database_url,
    env_settings,
    hosted_settings,
    is_hosted,
    open_client,
    open_store,
    redact,
)
from dormant.cli.errors import DEBUG_FLAG, PROG, reported, say
from dormant.cli.forks import diff, fork, replay
from dormant.cli.options import (
    DatabaseOption,
    JsonOption,
    check_agents,
    check_priority,
    port_option,
)
from dormant.cli.output import print_rich
from dormant.cli.retention import prune, quarantine, retry
from dormant.cli.serve import serve
from dormant.cli.usage import raise_budget, usage
from dormant.cli.versions import versions
from dormant.cli.workers import beat, worker

if TYPE_CHECKING:
    from celery import Celery

    from dormant.settings import Settings
    from dormant.stores.base import QueryStore, ThreadStatus

__all__ = ["app", "run_hosted"]

HELP = """dormant: a durable runtime for LLM agents on Celery.

A failure is one "error:" line on stderr (--debug shows the traceback).

\b
Exit codes (README.md, "Errors are one line"):
  0  done
  1  refused: unknown thread, call or agent; a message id already received; a closed
     thread
  2  the command line is wrong: an unknown command or option, a bad option value;
     running it again cannot help
  3  the deployment cannot serve it, nothing was done: a server is unreachable, the
     database has no schema or is read-only, its role lacks a privilege, a DORMANT_*
     setting is invalid, the port is in use; running it again later may work
"""

# Plain Click help (rich_markup_mode=None): Typer's rich panels print "<bool>" after every
# flag and keep a docstring's line breaks; plain help wraps paragraphs and shows no type
# for a flag. Usage errors are Click's plain "Usage: ... Error: ..." lines too.
app = typer.Typer(
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},  # a wide terminal shows whole summaries
    pretty_exceptions_show_locals=False,  # --debug tracebacks must not print passwords
)
db = typer.Typer(help="Database schema commands.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(db, name="db")
app.add_typer(approvals, name="approvals")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"dormant {version('dormant')}")
        raise typer.Exit()


@app.callback()
def main(
    debug: bool = typer.Option(
        False, "--debug", help="Show tracebacks (also DORMANT_DEBUG=1).", show_default=False
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    del version  # handled by its eager callback
    DEBUG_FLAG.set(debug)


@app.command()
@reported
def demo() -> None:
    """Run the embedded demo: an agent that sleeps between tool calls (no servers)."""
    from rich.console import Console

    from dormant.demo import run_demo

    run_demo(Console())


@db.command("upgrade")
@reported
def db_upgrade(database_url: str | None = DatabaseOption) -> None:
    """Create or migrate the schema to the newest version (creates a SQLite file)."""
    from dormant.stores.sql.store import upgrade
    from dormant.stores.sql.versions import schema_head

    settings = env_settings()
    url = checked_database_url(database_url or settings.database_url)
    check_sqlite_directory(url)
    found = upgrade(url, table_prefix=settings.table_prefix)
    if found is None:  # what this run did, for an operator checking a deploy
        typer.echo(f"created the schema at {schema_head()}")
    elif found != schema_head():
        typer.echo(f"migrated the schema from {found} to {schema_head()}")
    prefix = f" (tables prefixed {settings.table_prefix!r})" if settings.table_prefix else ""
    typer.echo(f"schema of {redact(url)} is up to date{prefix}")


@app.command()
@reported
def threads(
    status: str | None = typer.Option(None, help="Only threads with this status."),
    limit: int = typer.Option(50, min=1, help="How many root threads to list."),
    database_url: str | None = DatabaseOption,
    as_json: bool = JsonOption,
) -> None:
    """Threads as a tree: status, pending calls, subscriptions, inbox depth, quarantine."""
    from dormant.ops.inspect import thread_records, thread_tree
    from dormant.stores.base import ThreadStatus

    wanted = _status(status, ThreadStatus) if status else None
    with closing(open_store(database_url)) as store:
        listed = store.threads(wanted, limit)
        if as_json:
            _print_json(thread_records(store, listed))
        elif not listed:
            typer.echo("no threads")
        else:
            print_rich(thread_tree(store, listed))


@app.command()
@reported
def show(
    thread_id: str,
    database_url: str | None = DatabaseOption,
    as_json: bool = JsonOption,
    full: bool = typer.Option(
        False, "--full", help="Every stored item, including those a summary replaced."
    ),
    traces: bool = typer.Option(
        False,
        "--traces",
        help="Instead: each applied message and the trace of the slice that applied it "
        "(links with DORMANT_TRACE_URL_TEMPLATE; docs/tracing.md).",
    ),
) -> None:
    """A thread's timeline: what its model sees, inherited items dimmed."""
    from dormant.ops.inspect import timeline, timeline_record

    with closing(open_store(database_url)) as store:
        if traces:
            _show_traces(store, thread_id, as_json)
        elif as_json:
            _print_json(timeline_record(store, thread_id, full=full))
        else:
            print_rich(timeline(store, thread_id, full=full))


def _show_traces(store: QueryStore, thread_id: str, as_json: bool) -> None:
    from dataclasses import asdict

    from dormant.tracing.links import trace_chain

    store.thread(thread_id)  # an unknown thread is an error, not an empty chain
    chain = trace_chain(store, thread_id, env_settings().trace_url_template)
    if as_json:
        _print_json([asdict(m) for m in chain])
        return
    if not chain:
        typer.echo("no traced messages (tracing off, or their rows were pruned)")
    for m in chain:
        typer.echo(f"{m.trace_id}  {m.kind:<7} {m.message_id}  {m.url or ''}".rstrip())


def _check_upgrade(agents_module: str | None, database_url: str | None, as_json: bool) -> None:
    from dormant.agents import AgentRegistry
    from dormant.cli.client import cwd_importable
    from dormant.errors import ConfigurationError
    from dormant.ops.upgrade_check import check_upgrade

    module = agents_module or env_settings().agents_module
    if not module:
        raise ConfigurationError("dormant check --upgrade needs --agents MODULE or DORMANT_AGENTS")
    with cwd_importable():
        agents = AgentRegistry.from_module(module)
    with closing(open_store(database_url)) as store:
        problems = list(check_upgrade(store, agents))
    found = f"{len(problems)} problem(s) for {module}" if problems else "no problems found"
    records = [{"thread_id": p.thread_id, "kind": p.kind, "detail": p.detail} for p in problems]
    _report(records, [str(p) for p in problems], f"{found} in the open threads", as_json)


@app.command()
@reported
def check(
    grace_s: float = typer.Option(
        60.0, "--grace-s", min=0, help="Work younger than this is in flight, not stuck."
    ),
    upgrade: bool = typer.Option(
        False,
        "--upgrade",
        help="Instead: check the open threads against the agents of --agents (a deploy's "
        "new code): gone agents and tools, stored arguments that no longer validate.",
    ),
    agents_module: str | None = typer.Option(
        None,
        "--agents",
        help="With --upgrade: the new agents module (default DORMANT_AGENTS).",
        callback=check_agents,
    ),
    database_url: str | None = DatabaseOption,
    as_json: bool = JsonOption,
) -> None:
    """Check the runtime's promises over every stored thread; exit 1 if any is broken.

    With --upgrade, check what a deploy of the agents in --agents would meet in the open
    threads instead (docs/upgrades.md); exit 1 if anything would not run.
    """
    from dormant.ops.check import check_store

    if upgrade:
        _check_upgrade(agents_module, database_url, as_json)
        return
    if agents_module is not None:
        raise typer.BadParameter("--agents goes with --upgrade", param_hint="--agents")
    with closing(open_store(database_url)) as store:
        problems = check_store(store, grace_s=grace_s)
    records = [{"thread_id": p.thread_id, "rule": p.rule, "detail": p.detail} for p in problems]
    found = f"{len(problems)} problem(s) found" if problems else "no problems found"
    _report(records, [str(p) for p in problems], found, as_json)


def _report(records: list[dict[str, str]], lines: list[str], summary: str, as_json: bool) -> None:
    """A check's findings, as lines and a summary or as JSON; exit 1 if there are any."""
    if as_json:
        _print_json(records)
    else:
        for line in lines:
            typer.echo(line)
        typer.echo(summary)
    if records:
        raise typer.Exit(1)


@app.command()
@reported
def launch(
    agent: str,
    text: str,
    thread_id: str | None = typer.Option(
        None, "--thread-id", help="Choose the thread id: running the command again is harmless."
    ),
    message_id: str | None = typer.Option(None, "--message-id", help="Idempotency key."),
    agents: str | None = typer.Option(
        None,
        "--agents",
        help="Module defining the agents (default DORMANT_AGENTS): refuses unknown names.",
        callback=check_agents,
    ),
    priority: str = typer.Option(
        "interactive",
        "--priority",
        help="interactive (a person waits) or background (queued behind user text).",
        callback=check_priority,
        metavar="interactive|background",
    ),
) -> None:
    """Start a thread of AGENT with user TEXT; prints its id (needs the DORMANT_* URLs)."""
    with open_client(agents) as client:
        launched = client.launch(
            agent, text, thread_id=thread_id, message_id=message_id, priority=priority
        )
        typer.echo(launched)


@app.command()
@reported
def send(
    thread_id: str,
    text: str,
    message_id: str | None = typer.Option(None, "--message-id", help="Idempotency key."),
) -> None:
    """Queue user TEXT for a thread; prints the message id."""
    with open_client() as client:
        typer.echo(client.send(thread_id, text, message_id=message_id))


@app.command()
@reported
def deliver(
    thread_id: str,
    call_id: str,
    result: str,
    message_id: str | None = typer.Option(None, "--message-id", help="Idempotency key."),
    error: bool = typer.Option(False, "--error", help="The result is an error."),
) -> None:
    """Deliver RESULT for a call, as a trusted operator (no callback token)."""
    with open_client() as client:
        typer.echo(
            client.deliver(thread_id, call_id, result, message_id=message_id, is_error=error)
        )


@app.command("close")
@reported
def close_command(
    thread_id: str,
    reason: str = typer.Option(
        "closed by an operator", "--reason", help="Kept on the thread's record."
    ),
) -> None:
    """Close a thread and its descendants: pending calls answered with an error, queued and
    later messages refused, a running slice stopped. Closing it again changes nothing."""
    with open_client() as client:
        closed = client.close_thread(thread_id, reason=reason)
        typer.echo(f"thread {closed.id} is closed: {closed.closed_reason}")


@app.command()
@reported
def callbacks(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = port_option(8765),
) -> None:
    """Serve callback URLs and approval links (development server; mount dormant.callbacks
    in production, and answer links with dormant serve)."""
    from dormant.cli.listen import cannot_listen
    from dormant.http.approval_links import with_links
    from dormant.http.callbacks import callback_app
    from dormant.http.dev_server import make_dev_server

    with open_client(verifies_urls=True) as client:
        try:
            server = make_dev_server(host, port, with_links(client, callback_app(client)))
        except OSError as error:
            raise cannot_listen(host, port, error) from None
        with server:
            say(f"receiving callbacks on http://{host}:{server.server_port}/")
            server.serve_forever()


def _status(value: str, kind: type[ThreadStatus]) -> ThreadStatus:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(s.value for s in kind)
        raise typer.BadParameter(f"{value!r} is not a status; choose from {choices}") from None


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False))


def _own_celery_app(command: Callable[..., None]) -> Callable[..., None]:
    """Under a host framework the worker and beat are the project's Celery app's: a
    dormant-only app would run none of the project's tasks nor read its Celery settings."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        if is_hosted():  # a wrong command line (exit 2): typing it again cannot help
            name = command.__name__
            say(
                f"error: `dormant {name}` is not run: your project's {name} is its own "
                f"Celery app's, which runs its tasks and reads its Celery settings; run "
                f"`celery -A <your Celery app> {name}` (docs/django.md, docs/flask.md)"
            )
            raise typer.Exit(2)
        command(*args, **kwargs)

    return run


_PROJECT_RUNS_THEM = ("worker", "beat")
"""Commands refused under a host framework (``_own_celery_app``): its --help omits them."""


@contextmanager
def _hidden(names: Sequence[str]) -> Iterator[None]:
    """The commands named ``names`` left out of ``--help`` while inside."""
    infos = [c for c in app.registered_commands if c.callback and c.callback.__name__ in names]
    was = [info.hidden for info in infos]
    for info in infos:
        info.hidden = True
    try:
        yield
    finally:
        for info, hidden in zip(infos, was, strict=True):
            info.hidden = hidden


def run_hosted(
    args: Sequence[str],
    *,
    prog_name: str,
    settings: Callable[[], Settings],
    celery_app: Celery | None = None,
) -> int:
    """Run one ``dormant`` command (``args`` as typed after ``dormant``) with the settings
    the host framework supplies; its exit code. Behind ``python manage.py dormant`` and
    ``flask dormant``, so a project's commands reach the database its web processes use
    and, with ``celery_app``, send their wakes through the project's Celery app."""
    typed = PROG.set(prog_name)
    with hosted_settings(settings, celery_app), _hidden(_PROJECT_RUNS_THEM):
        try:
            app(args=list(args), prog_name=prog_name)
        except SystemExit as done:
            code = done.code
            if code is None or isinstance(code, int):
                return code or 0
            typer.echo(code, err=True)
            return 1
        finally:
            PROG.reset(typed)
    return 0


app.command()(reported(retry))
app.command()(reported(quarantine))
app.command()(reported(prune))
app.command()(reported(usage))
app.command("raise-budget")(reported(raise_budget))
app.command()(reported(versions))
app.command()(reported(fork))
app.command()(reported(diff))
app.command()(reported(replay))
app.command()(reported(_own_celery_app(worker)))
app.command()(reported(_own_celery_app(beat)))
app.command()(reported(serve))
