"""A bench worker: ``celery_app.app`` run by ``dormant.celery.worker_process.start_worker``, the way
``dormant worker`` runs its own app (the bench's app also has its baseline tasks).

    python bench/celery_worker.py CONCURRENCY NODE_NAME

With ``DORMANT_BENCH_PROBE=1`` (``bench/wake_stages.py``) it stamps each stage of a wake
(``bench/wake_probe.py``) and sends the stamps to Redis after each task.
"""

from __future__ import annotations

import os
import sys

import celery_app
from celery_app import app

from dormant.celery.worker_process import start_worker

if __name__ == "__main__":
    concurrency, hostname = int(sys.argv[1]), sys.argv[2]
    if os.environ.get("DORMANT_BENCH_PROBE") == "1":
        from wake_probe import install_worker_probes

        stages = celery_app.key("stages")
        install_worker_probes(lambda key, stamps: celery_app._redis().hset(stages, key, stamps))
    sys.exit(start_worker(app, concurrency=concurrency, loglevel="warning", hostname=hostname))
