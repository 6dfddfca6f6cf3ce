"""The ``dormant`` command."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console

from dormant.cli_celery import beat, worker
from dormant.cli_serve import serve
from dormant.errors import DormantError
from dormant.settings import Settings

if TYPE_CHECKING:
    from dormant.client import Client
    from dormant.stores.base import ThreadStatus
    from dormant.stores.sql import SQLStore

__all__ = ["app"]

app = typer.Typer(
    help="dormant: a durable runtime for LLM agents on Celery.",
    no_args_is_help=True,
    add_completion=False,
)
db = typer.Typer(help="Database schema commands.", no_args_is_help=True)
app.add_typer(db, name="db")

F = TypeVar("F", bound=Callable[..., None])


def _reported(command: F) -> F:
    """Show dormant's own errors as one clear line and exit 1, not as a traceback."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except DormantError as error:
            Console(stderr=True).print(f"[bold red]error:[/] {error}", highlight=False)
            raise typer.Exit(1) from None

    return run  # type: ignore[return-value]


DatabaseOption = typer.Option(None, "--database-url", help="Defaults to DORMANT_DATABASE_URL.")


@app.command()
@_reported
def demo() -> None:
    """Run the embedded demo: an agent that sleeps between tool calls (no servers)."""
    from dormant.demo import run_demo

    run_demo(Console())


@db.command("upgrade")
@_reported
def db_upgrade(database_url: str | None = DatabaseOption) -> None:
    """Create or migrate the schema to the newest version."""
    from dormant.stores.sql import upgrade

    url = database_url or Settings.from_env().database_url
    upgrade(url)
    Console().print(f"schema of {_redact(url)} is up to date")


@app.command()
@_reported
def threads(
    status: str | None = typer.Option(None, help="Only threads with this status."),
    limit: int = typer.Option(50, min=1, help="How many root threads to list."),
    database_url: str | None = DatabaseOption,
) -> None:
    """Threads as a tree: status, pending calls, subscriptions, inbox depth."""
    from dormant.inspect import thread_tree
    from dormant.stores.base import ThreadStatus

    wanted = _status(status, ThreadStatus) if status else None
    store = _store(database_url)
    listed = store.threads(wanted, limit)
    if not listed:
        Console().print("no threads")
        return
    Console().print(thread_tree(store, listed))


@app.command()
@_reported
def show(thread_id: str, database_url: str | None = DatabaseOption) -> None:
    """A thread's timeline: what its model sees, inherited items dimmed."""
    from dormant.inspect import timeline

    Console().print(timeline(_store(database_url), thread_id))


@app.command()
@_reported
def retry(thread_id: str, database_url: str | None = DatabaseOption) -> None:
    """Re-drive a stalled thread: its queued messages are applied by the next sweep."""
    from dormant.history import pending
    from dormant.stores.base import ThreadStatus

    store = _store(database_url)
    snap = store.load(thread_id)
    if snap.thread.status is not ThreadStatus.STALLED:
        Console().print(f"thread {thread_id} is {snap.thread.status.value}, not stalled")
        raise typer.Exit(1)
    status = ThreadStatus.WAITING if pending(snap.calls) else ThreadStatus.IDLE
    store.set_status(thread_id, status)
    Console().print(f"thread {thread_id} is {status.value} again; the sweeper re-drives it")


@app.command()
@_reported
def launch(
    agent: str,
    text: str,
    thread_id: str | None = typer.Option(None, "--thread-id", help="Choose the thread id."),
) -> None:
    """Start a thread of AGENT with user TEXT (distributed: needs DORMANT_* URLs)."""
    with _client() as client:
        typer.echo(client.launch(agent, text, thread_id=thread_id))


@app.command()
@_reported
def send(
    thread_id: str,
    text: str,
    message_id: str | None = typer.Option(None, "--message-id", help="Idempotency key."),
) -> None:
    """Queue user TEXT for a thread; prints the message id."""
    with _client() as client:
        typer.echo(client.send(thread_id, text, message_id=message_id))


@app.command()
@_reported
def deliver(
    thread_id: str,
    call_id: str,
    result: str,
    message_id: str | None = typer.Option(None, "--message-id", help="Idempotency key."),
    error: bool = typer.Option(False, "--error", help="The result is an error."),
) -> None:
    """Deliver RESULT for a call, as a trusted operator (no callback token)."""
    with _client() as client:
        typer.echo(
            client.deliver(thread_id, call_id, result, message_id=message_id, is_error=error)
        )


@app.command()
@_reported
def callbacks(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8765, help="Port to listen on."),
) -> None:
    """Serve callback URLs (development server; mount dormant.callbacks in production)."""
    from wsgiref.simple_server import make_server

    from dormant.callbacks import callback_app

    with _client() as client, make_server(host, port, callback_app(client)) as server:
        Console().print(f"receiving callbacks on http://{host}:{server.server_port}/")
        server.serve_forever()


def _client() -> Client:
    from dormant.client import Client

    return Client.from_env()


def _store(database_url: str | None) -> SQLStore:
    from dormant.stores.sql import SQLStore

    return SQLStore(database_url or Settings.from_env().database_url)


def _status(value: str, kind: type[ThreadStatus]) -> ThreadStatus:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(s.value for s in kind)
        raise typer.BadParameter(f"{value!r} is not a status; choose from {choices}") from None


def _redact(url: str) -> str:
    """The URL without its password, for printing."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    scheme, _, credentials = head.partition("://")
    return f"{scheme}://{credentials.split(':')[0]}:***@{tail}"


app.command()(worker)
app.command()(beat)
app.command()(serve)


if __name__ == "__main__":
    app()
