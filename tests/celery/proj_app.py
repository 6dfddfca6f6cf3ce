"""A user's existing Celery app, as a Django or Flask project has it: its own broker settings,
its own default queue and its own task, with dormant installed beside them.

Started by the tests as ``celery -A proj_app worker`` with no ``-Q``: what a new user runs.
"""

from __future__ import annotations

import os

from celery import Celery
from celery_agents import AGENTS, worker_redis

from dormant.worker import install

__all__ = ["app", "record"]

app = Celery("proj")
app.conf.update(
    broker_url=os.environ["DORMANT_BROKER_URL"],
    broker_transport_options={"global_keyprefix": os.environ["DORMANT_BROKER_KEY_PREFIX"]},
    task_default_queue="proj",
    task_ignore_result=True,
)


@app.task(name="proj.record")
def record(value: str) -> None:
    """The project's own ordinary task: leaves ``value`` where the test can see it."""
    worker_redis().rpush(f"{os.environ['DORMANT_KEY_PREFIX']}:test:proj", value)


install(app, agents=AGENTS)
