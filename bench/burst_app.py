"""The worker side of ``bench/burst.py``: its one agent, and the slice tasks it counts.

``dormant worker --agents burst_app`` imports this module (``bench/`` on ``PYTHONPATH``);
``BURST_PROVIDER_URL`` is the driver's rate-limited server. The agent ``burst`` answers
every message with one streamed completion from that server, through ``OpenAIModel``
exactly as a deployment would call a provider. Slot time asleep in backoff is the
workers' own admission counter (``<prefix>:admission``, ``asleep_s``), kept with and
without limits.

The bench's own counters, in the hash ``<prefix>:burst`` (Celery's signals, connected when
the worker imports this module; nothing of the package counts them): ``slice_tasks``, every
``dormant.slice`` task a worker ran (a retry is a task of its own), and ``retries``, the
slice tasks that asked Celery to run them again (``self.retry``).
"""

from __future__ import annotations

import os
from typing import Any

from dormant import Agent
from dormant.models import OpenAIModel

MODEL = "bench-burst"
SLICE_TASK = "dormant.slice"
COUNTERS = "burst"
"""The hash (after the deployment's key prefix) the bench's counters are kept in."""

AGENTS = [
    Agent(
        "burst",
        model=OpenAIModel(
            MODEL, base_url=os.environ.get("BURST_PROVIDER_URL", "http://127.0.0.1:9/v1")
        ),
        instructions="Summarise the event in one line.",
    )
]


def _count_slice_tasks() -> None:
    """Count slice tasks and their Celery retries in Redis, from the worker's signals."""
    if "BURST_PROVIDER_URL" not in os.environ:  # imported by the driver, not a worker
        return
    import redis
    from celery.signals import task_prerun, task_retry

    client = redis.Redis.from_url(os.environ["DORMANT_REDIS_URL"])
    key = f"{os.environ['DORMANT_KEY_PREFIX']}:{COUNTERS}"

    def started(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) == SLICE_TASK:
            client.hincrby(key, "slice_tasks", 1)

    def retried(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) == SLICE_TASK:
            client.hincrby(key, "retries", 1)

    task_prerun.connect(started, weak=False)
    task_retry.connect(retried, weak=False)
    trace = os.environ.get("BURST_TRACE_ADMISSION")
    if trace:  # every deferral, with its wait: where a burst's slice tasks go
        import logging

        handler = logging.FileHandler(trace)
        handler.setFormatter(logging.Formatter("%(created).3f %(message)s"))
        logger = logging.getLogger("dormant.admission")
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)


_count_slice_tasks()
