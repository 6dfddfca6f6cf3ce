"""The client behind ``dormant launch``, ``send``, ``deliver`` and ``callbacks``.

It checks the ``DORMANT_*`` URLs before connecting, keeps library log lines (and their
tracebacks) off the terminal unless ``--debug``, and turns a wake that failed after the
message was saved into one line instead of a failure: the message is stored and the
sweeper (``dormant beat``) wakes the thread once the broker is back.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from dormant.agents import AgentRegistry
from dormant.cli.errors import debugging, explain, say
from dormant.client import Client
from dormant.errors import ConfigurationError
from dormant.settings import Settings

__all__ = ["CommandClient", "connect_client"]

_REDIS_SCHEMES = ("redis", "rediss", "unix")


class CommandClient(Client):
    """A ``Client`` that reports a failed wake as one line on stderr."""

    def wake_failed(self, thread_id: str, error: Exception) -> None:
        known = explain(error)
        detail = str(known) if known is not None else f"{type(error).__name__}: {error}"
        say(
            f"warning: thread {thread_id} is saved; the broker is unreachable ({detail}), "
            "so the sweeper will wake it"
        )

    def close_incomplete(self, thread_id: str, missed: str, error: Exception) -> None:
        known = explain(error)
        detail = str(known) if known is not None else f"{type(error).__name__}: {error}"
        say(f"warning: thread {thread_id} is closed, but {missed} ({detail})")


def connect_client(
    settings: Settings, agents_module: str | None, *, check_database: Callable[[str], None]
) -> CommandClient:
    """A client for ``settings``, checked first; with ``agents_module`` (or
    ``DORMANT_AGENTS``) it knows the agents and refuses unknown names."""
    if not debugging():
        logging.basicConfig(handlers=[logging.NullHandler()])
    _check_url("DORMANT_REDIS_URL", settings.redis_url, _REDIS_SCHEMES)
    _check_url("DORMANT_BROKER_URL", settings.broker_url, ())
    check_database(settings.database_url)
    module = agents_module or settings.agents_module
    agents = None
    if module:
        with _cwd_importable():
            agents = AgentRegistry.from_module(module)
    return CommandClient.from_settings(settings, agents=agents)


def _check_url(name: str, url: str, schemes: tuple[str, ...]) -> None:
    scheme = urlsplit(url).scheme
    if not scheme or (schemes and scheme not in schemes):
        wanted = " or ".join(f"{s}://" for s in schemes) if schemes else "scheme://host"
        raise ConfigurationError(f"{name}={url!r} is not a URL: use {wanted}")


@contextmanager
def _cwd_importable() -> Iterator[None]:
    """Like ``celery -A``: the agents module may live in the current directory."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added:
            sys.path.remove(cwd)
