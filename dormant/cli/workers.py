"""``dormant worker`` and ``dormant beat``: a real Celery worker and beat, configured by dormant.

Mount them on the main Typer app with ``app.command()(worker)`` and ``app.command()(beat)``.
Both read ``DORMANT_*`` variables; the worker's ``--agents`` overrides ``DORMANT_AGENTS``.
The same processes run with ``celery -A dormant.worker worker -P threads`` and
``celery -A dormant.worker beat`` when ``DORMANT_AGENTS`` is set.
"""

from __future__ import annotations

from typing import Annotated

import typer

from dormant.settings import Settings

__all__ = ["beat", "worker"]

_DEFAULT_QUEUES = "dormant.interactive,dormant.background,dormant.tools"


def worker(
    agents: Annotated[
        str, typer.Option("--agents", help="Module defining the agents, e.g. myapp.agents.")
    ] = "",
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", help="Worker threads (slices wait on I/O).")
    ] = 8,
    queues: Annotated[
        str, typer.Option("--queues", "-Q", help="Comma-separated queues to consume.")
    ] = _DEFAULT_QUEUES,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "info",
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


def beat(loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "info") -> None:
    """Run Celery beat: fires timers and re-drives stranded work (one per deployment)."""
    from dormant.celery.worker_process import run_beat
    from dormant.cli.connect import check_schema

    settings = Settings.from_env()
    check_schema(settings)
    run_beat(settings, loglevel=loglevel)
