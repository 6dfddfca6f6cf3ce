"""``proj_app``'s project with its agents named by module, as the docs show
(``install(app, agents="proj.agents")``): the module is ``PROJ_AGENTS``.

Started by the tests as ``celery -A proj_named_app worker``.
"""

from __future__ import annotations

import os

import celery_agents  # noqa: F401  (the worker's ready mark, whatever the agents module)
from celery import Celery

from dormant.worker import install

__all__ = ["app"]

app = Celery("proj")
app.conf.update(
    broker_url=os.environ["DORMANT_BROKER_URL"],
    broker_transport_options={"global_keyprefix": os.environ["DORMANT_BROKER_KEY_PREFIX"]},
    task_default_queue="proj",
    task_ignore_result=True,
)

install(app, agents=os.environ["PROJ_AGENTS"])
