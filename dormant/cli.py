"""The ``dormant`` command."""

from __future__ import annotations

import typer
from rich.console import Console

from dormant.settings import Settings

__all__ = ["app"]

app = typer.Typer(
    help="dormant: a durable runtime for LLM agents on Celery.",
    no_args_is_help=True,
    add_completion=False,
)
db = typer.Typer(help="Database schema commands.", no_args_is_help=True)
app.add_typer(db, name="db")

DatabaseOption = typer.Option(None, "--database-url", help="Defaults to DORMANT_DATABASE_URL.")


@app.command()
def demo() -> None:
    """Run the embedded demo: an agent that sleeps between tool calls (no servers)."""
    from dormant.demo import run_demo

    run_demo(Console())


@db.command("upgrade")
def db_upgrade(database_url: str | None = DatabaseOption) -> None:
    """Create or migrate the schema to the newest version."""
    from dormant.stores.sql import upgrade

    url = database_url or Settings.from_env().database_url
    upgrade(url)
    Console().print(f"schema of {_redact(url)} is up to date")


def _redact(url: str) -> str:
    """The URL without its password, for printing."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    scheme, _, credentials = head.partition("://")
    return f"{scheme}://{credentials.split(':')[0]}:***@{tail}"
