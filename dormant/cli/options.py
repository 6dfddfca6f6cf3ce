"""Options shared by several commands, checked while the command line is parsed.

A value typed on the command line that cannot be used is a usage error (exit 2, Click's
``Invalid value for '--port'`` line), never exit 3: a script that retries on 3 (the
deployment cannot serve the command *now*) must not retry a typo. The same value read from
a ``DORMANT_*`` variable is a setting, and stays exit 3 (``cli/errors.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

__all__ = [
    "PRIORITIES",
    "DatabaseOption",
    "JsonOption",
    "check_age",
    "check_agents",
    "check_priority",
    "check_since",
    "checked_by",
    "port_option",
]

PRIORITIES = ("interactive", "background")


def checked_by(check: Callable[[str], Any]) -> Callable[[str | None], str | None]:
    """A Click callback running ``check`` on a given value: a ``DormantError`` it raises
    becomes a usage error naming the option; the value itself is kept as typed."""

    def callback(value: str | None) -> str | None:
        from dormant.errors import DormantError

        if value is None:
            return None
        try:
            check(value)
        except DormantError as error:
            raise typer.BadParameter(str(error)) from None
        return value

    return callback


def _database_url(value: str) -> None:
    from dormant.cli.connect import checked_database_url

    checked_database_url(value)


DatabaseOption: Any = typer.Option(
    None,
    "--database-url",
    help="Defaults to DORMANT_DATABASE_URL.",
    callback=checked_by(_database_url),
)
JsonOption: Any = typer.Option(False, "--json", help="Print JSON on stdout instead of text.")


def _agents_module(value: str) -> None:
    """Refuse a module that is not there (a typo); one that is there but fails to import
    is the command's to report (exit 3: the deployment's code or dependencies)."""
    import importlib.util

    from dormant.cli.client import cwd_importable
    from dormant.errors import ConfigurationError

    if not value:
        return  # "" means DORMANT_AGENTS (the worker's default)
    with cwd_importable():
        try:
            found = importlib.util.find_spec(value) is not None
        except ModuleNotFoundError:
            found = False  # a parent package is missing too
        except Exception:
            return  # a parent package failed to import: the command says why
    if not found:
        raise ConfigurationError(
            f"there is no module {value!r} here: give a module path such as myapp.agents, "
            "importable from the current directory or PYTHONPATH"
        )


def _priority(value: str) -> None:
    from dormant.errors import ConfigurationError

    if value not in PRIORITIES:
        raise ConfigurationError(f"{value!r} is not a priority: use {' or '.join(PRIORITIES)}")


def _age(value: str) -> None:
    from dormant.ops.prune import parse_age

    parse_age(value)


def _since(value: str) -> None:
    from dormant.ops.usage import parse_since

    parse_since(value)


check_agents = checked_by(_agents_module)
check_priority = checked_by(_priority)
check_age = checked_by(_age)
check_since = checked_by(_since)


def port_option(default: int) -> Any:
    """``--port``: 0 (any free port) to 65535, refused while parsing, before anything
    is built or bound."""
    return typer.Option(default, "--port", min=0, max=65535, help="Port to listen on.")
