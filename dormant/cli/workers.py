"""``dormant worker`` and ``dormant beat``: a real Celery worker and beat, configured by dormant.

Mount them on the main Typer app with ``app.command()(worker)`` and ``app.command()(beat)``.
Both read ``DORMANT_*`` variables; the worker's ``--agents`` overrides ``DORMANT_AGENTS``.
The same processes run with ``celery -A dormant.worker worker -P threads`` and
``celery -A dormant.worker beat`` when ``DORMANT_AGENTS`` is set.
"""

from __future__ import annotations

from typing import Annotated

import typer

from dormant.cli.options import check_agents
from dormant.settings import Settings

__all__ = ["beat", "worker"]

_DEFAULT_QUEUES = "dormant.interactive,dormant.background,dormant.tools"
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical", "fatal")


def _log_level(value: str) -> str:
    """Celery's levels, refused while parsing: Celery itself would fail after starting."""
    if value.lower() not in _LOG_LEVELS:
        raise typer.BadParameter(f"{value!r} is not a log level: use {', '.join(_LOG_LEVELS)}")
    return value.lower()


def _queue_list(value: str) -> str:
    if not [q for q in value.split(",") if q.strip()]:
        raise typer.BadParameter("name at least one queue, e.g. dormant.interactive")
    return value


LogLevelOption = typer.Option(
    "--loglevel", "-l", callback=_log_level, help=f"Celery's: {', '.join(_LOG_LEVELS)}."
)


def worker(
    agents: Annotated[
        str,
        typer.Option(
            "--agents", callback=check_agents, help="Module defining the agents, e.g. myapp.agents."
        ),
    ] = "",
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", "-c", min=1, help="Worker threads (slices wait on I/O)."),
    ] = 8,
    queues: Annotated[
        str,
        typer.Option(
            "--queues", "-Q", callback=_queue_list, help="Comma-separated queues to consume."
        ),
    ] = _DEFAULT_QUEUES,
    loglevel: Annotated[str, LogLevelOption] = "info",
    hostname: Annotated[
        str,
        typer.Option(
            "--hostname", "-n", help="Celery node name, e.g. w1@%h (%h, %n, %d as in Celery)."
        ),
    ] = "",
) -> None:
    """Run a Celery worker (threads pool) that runs slices and tools."""
    from dormant.celery.worker_process import run_worker
    from dormant.cli.connect import check_schema

    settings = Settings.from_env().require_secret()  # a worker signs callback URLs
    if agents:
        settings = settings.with_(agents_module=agents)
    check_schema(settings)  # not `ready.` and then a failure in every slice
    names = [q.strip() for q in queues.split(",") if q.strip()]
    code = run_worker(
        settings,
        concurrency=concurrency,
        queues=names,
        loglevel=loglevel,
        hostname=hostname or None,
    )
    if code:
        raise typer.Exit(code)  # a lost worker exits non-zero, so supervisors restart it


def beat(loglevel: Annotated[str, LogLevelOption] = "info") -> None:
    """Run Celery beat: fires timers and re-drives stranded work (one per deployment)."""
    from dormant.celery.worker_process import run_beat
    from dormant.cli.connect import check_schema

    settings = Settings.from_env()
    check_schema(settings)
    run_beat(settings, loglevel=loglevel)
