"""A bench worker: ``celery_app.app`` run by ``dormant.celery.worker_process.start_worker``, the way
``dormant worker`` runs its own app (the bench's app also has its baseline tasks).

    python bench/celery_worker.py CONCURRENCY NODE_NAME
"""

from __future__ import annotations

import sys

from celery_app import app

from dormant.celery.worker_process import start_worker

if __name__ == "__main__":
    concurrency, hostname = int(sys.argv[1]), sys.argv[2]
    sys.exit(start_worker(app, concurrency=concurrency, loglevel="warning", hostname=hostname))
