"""Running a Celery worker or beat in this process: ``dormant worker`` and ``dormant beat``.

Kept apart from ``dormant.worker``, which every process of a deployment imports (clients,
Flower, beat): these entry points load the worker's own modules only when they run.
"""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery

from dormant.agents import AgentSource
from dormant.celery.config import QUEUES
from dormant.settings import Settings
from dormant.worker import bare_app, create_app

__all__ = ["run_beat", "run_worker", "start_worker"]


def run_worker(
    settings: Settings,
    agents: AgentSource = None,
    *,
    concurrency: int = 8,
    queues: Sequence[str] = QUEUES,
    loglevel: str = "info",
    hostname: str | None = None,
) -> int:
    """Run a Celery worker in this process with the threads pool (slices wait on I/O);
    returns its exit code (non-zero when it stopped on an error)."""
    app = create_app(settings, agents)
    return start_worker(
        app, concurrency=concurrency, queues=queues, loglevel=loglevel, hostname=hostname
    )


def start_worker(
    celery_app: Celery,
    *,
    concurrency: int = 8,
    queues: Sequence[str] = QUEUES,
    loglevel: str = "info",
    hostname: str | None = None,
) -> int:
    """What ``celery -A app worker -P threads -c N -Q ... -l L -n H`` does, without Celery's
    command line: that imports every ``celery.commands`` plugin (Flower and its Tornado
    app) and ``click_repl``, about half of a worker's start-up CPU, for a worker that needs
    none of them. Returns the worker's exit code (``worker_main`` drops it)."""
    from celery.apps.worker import Worker  # the worker's own modules: not for clients
    from celery.utils.nodenames import default_nodename, host_format

    worker: Worker = celery_app.Worker(
        # As Celery's command line does for -n: "w1@%h" names the worker after this host
        # (%h, %n and %d: the host, its first label and its domain).
        hostname=host_format(default_nodename(hostname)) if hostname else None,
        pool_cls="threads",
        concurrency=concurrency,
        queues=list(queues),
        loglevel=loglevel,
    )
    worker.start()
    return int(worker.exitcode or 0)


def run_beat(settings: Settings, *, loglevel: str = "info") -> None:
    """Run Celery beat in this process: it sweeps every sweep interval itself
    (``celery/beat_sweep.py``, started on ``beat_init``) and sends ``dormant.prune`` when
    retention is on. Beat runs no agent's code, so it needs no agents."""
    bare_app(settings, None).start(["beat", "-l", loglevel])
