"""The client behind ``dormant launch``, ``send``, ``deliver`` and ``callbacks``.

Its settings checked the ``DORMANT_*`` URLs when they were built; it checks the database
before connecting, keeps library log lines (and their tracebacks) off the terminal unless
``--debug``, and turns a wake that failed after the
message was saved into one line instead of a failure: the message is stored and the
sweeper (``dormant beat``) wakes the thread once the broker is back.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dormant.agents import AgentRegistry
from dormant.cli.errors import debugging, explain, say
from dormant.client import Client
from dormant.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["CommandClient", "connect_client", "cwd_importable"]


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
    settings: Settings,
    agents_module: str | None,
    *,
    check_database: Callable[[str], None],
    celery_app: Celery | None = None,
) -> CommandClient:
    """A client for ``settings``, checked first; with ``agents_module`` (or
    ``DORMANT_AGENTS``) it knows the agents and refuses unknown names. With ``celery_app``
    (a host project's own) its wakes go through that app: the broker its workers read."""
    if not debugging():
        logging.basicConfig(handlers=[logging.NullHandler()])
    check_database(settings.database_url)
    module = agents_module or settings.agents_module
    agents = None
    if module:
        with cwd_importable():
            agents = AgentRegistry.from_module(module)
    return CommandClient.from_settings(settings, agents=agents, celery_app=celery_app)


@contextmanager
def cwd_importable() -> Iterator[None]:
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
