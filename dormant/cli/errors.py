"""How the ``dormant`` command fails: one line on stderr and an exit code, never a traceback.

Every command is wrapped in ``reported``; ``explain`` is the one place that turns what the
libraries underneath raise (SQLAlchemy, redis, kombu) into dormant's own errors, whose
messages say what to do. ``dormant --debug`` (or ``DORMANT_DEBUG=1``) shows the traceback.

Exit codes (documented in the README and ``dormant --help``):

- 0: done; a message saved while the broker is down is done too (the sweeper wakes it)
- 1: refused (unknown thread, call or agent; duplicate message; closed thread; bad input);
  also, silently, a stdout whose reader went away (``dormant threads | head``), as Click does
- 2: the command line itself is wrong (Click's usage errors): an unknown option, or a bad
  option value, checked while parsing (``options.py``). Running it again cannot help.
- 3: the deployment cannot serve the command: a server is unreachable, the database has no
  schema or is read-only or its role lacks a privilege, a ``DORMANT_*`` setting is
  invalid, the port is in use. Nothing
  was done; running it again later may work.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import typer

from dormant.errors import (
    BrokerUnavailable,
    ConfigurationError,
    DatabaseUnavailable,
    DormantError,
    MessageRejected,
    NotFound,
    RedisUnavailable,
    SchemaMissing,
    Unavailable,
)

__all__ = [
    "DATABASE_URL",
    "DEBUG_FLAG",
    "EXIT_REFUSED",
    "EXIT_UNAVAILABLE",
    "PROG",
    "debugging",
    "exit_code",
    "explain",
    "reported",
    "say",
]

EXIT_REFUSED = 1
EXIT_UNAVAILABLE = 3

PROG: ContextVar[str] = ContextVar("dormant_prog", default="dormant")
"""How the command was typed: ``python manage.py dormant`` or ``flask dormant`` when a host
framework runs it (``run_hosted``), so the hints in messages name a command that works."""

F = TypeVar("F", bound=Callable[..., None])


def say(line: str) -> None:
    """One line for a person, on stderr (stdout carries only ids and JSON); a command it
    names (`` `dormant db upgrade` ``) is spelled as this one was typed."""
    prog = PROG.get()
    if prog != "dormant":
        line = line.replace("`dormant ", f"`{prog} ").replace("(dormant --", f"({prog} --")
    typer.echo(line, err=True)


def reported(command: F) -> F:
    """Run ``command``; turn any failure into one line on stderr and an exit code."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.TyperException, KeyboardInterrupt):
            raise  # usage errors (exit 2) are Typer's to show
        except BrokenPipeError:
            raise  # stdout's reader went away (`| head`): Click exits 1, saying nothing
        except Exception as exc:
            if debugging():
                raise
            error = explain(exc)
            if error is None:
                say(f"error: unexpected {type(exc).__name__}: {_first_line(str(exc))}")
                say("       (dormant --debug shows the traceback)")
                raise typer.Exit(EXIT_REFUSED) from None
            say(f"error: {error}")
            raise typer.Exit(exit_code(error)) from None

    return run  # type: ignore[return-value]


def exit_code(error: DormantError) -> int:
    if isinstance(error, NotFound | MessageRejected):
        return EXIT_REFUSED
    if isinstance(error, Unavailable | ConfigurationError):
        return EXIT_UNAVAILABLE
    return EXIT_REFUSED


def explain(exc: BaseException) -> DormantError | None:
    """dormant's error for ``exc``, or None for a bug. Libraries are only consulted if
    already imported: an exception of theirs cannot exist otherwise."""
    if isinstance(exc, DormantError):
        return exc
    if "sqlalchemy" in sys.modules:
        found = _sqlalchemy(exc)
        if found is not None:
            return found
    if "kombu" in sys.modules:
        from kombu.exceptions import OperationalError as KombuOperational

        if isinstance(exc, KombuOperational):
            return BrokerUnavailable(_first_line(str(exc)))
    if "redis" in sys.modules:
        from redis.exceptions import ConnectionError as RedisConnection
        from redis.exceptions import TimeoutError as RedisTimeout

        if isinstance(exc, RedisConnection | RedisTimeout):
            return RedisUnavailable(_first_line(str(exc)))
    return None


def _sqlalchemy(exc: BaseException) -> DormantError | None:
    from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError

    if isinstance(exc, ArgumentError):
        return ConfigurationError(_first_line(str(exc)))
    if not isinstance(exc, DBAPIError):
        return None
    detail = _first_line(str(exc.orig))
    if _is_missing_table(exc):
        return SchemaMissing(f"the database has no dormant tables ({detail})")
    if getattr(exc.orig, "sqlstate", None) == "42501":  # PostgreSQL: insufficient_privilege
        return ConfigurationError(
            f"the database role lacks a privilege ({detail}): grant it as docs/security.md "
            "shows (the tables, and USAGE on their sequences)"
        )
    if "readonly database" in detail:  # SQLite: the file, or its directory, is not writable
        return ConfigurationError(
            f"{_sqlite_file()} is read-only for this user ({detail}): make the file and its "
            "directory writable (SQLite writes its -wal and -shm files beside it)"
        )
    if isinstance(exc, OperationalError | InterfaceError):
        return DatabaseUnavailable(detail)
    return None


def _is_missing_table(exc: Any) -> bool:
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == "42P01":  # PostgreSQL: undefined_table
        return True
    return str(orig).startswith("no such table")  # SQLite


def _sqlite_file() -> str:
    from sqlalchemy.engine import make_url

    url = DATABASE_URL.get()
    path = make_url(url).database if url else None
    return f"the SQLite database {path!r}" if path else "the SQLite database"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "(no message)"


DATABASE_URL: ContextVar[str | None] = ContextVar("dormant_database_url", default=None)
"""The database the command opened (``connect.py``), for messages that must name its file."""

DEBUG_FLAG: ContextVar[bool] = ContextVar("dormant_debug_flag", default=False)
"""``dormant --debug``: set by the root command for the invocation it runs."""


def debugging() -> bool:
    """``--debug`` on the command line, else ``DORMANT_DEBUG`` (a bad value means no)."""
    if DEBUG_FLAG.get():
        return True
    from dormant.settings import Settings

    try:
        return Settings.from_env().debug
    except DormantError:
        return False
