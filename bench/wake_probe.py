"""Stamps for ``bench/wake_stages.py``: the wall clock at each stage of a wake, taken by
wrappers installed in a bench process, never by dormant itself.

``install_client_probes`` wraps, in the driver, the store's ``enqueue`` (the message's
``INSERT`` and commit) and the broker channel's ``_put`` (the publish: the claim-and-push
script of a wake, the ``LPUSH`` of a no-op); ``install_worker_probes``, in a bench worker
started with ``DORMANT_BENCH_PROBE=1`` (``bench/celery_worker.py``), wraps the broker
channel's ``BRPOP`` read, Celery's ``task_received``, ``task_prerun`` and ``task_postrun``
signals, ``run_slice``, the lease's ``acquire``, the store's ``load``, the slice's
conversation, admission and the model call. A worker sends its stamps for a task to the
Redis hash ``<prefix>:bench:stages`` after the task (outside the measured interval).
Each stamp is ``time.time()``: one clock for both processes on one machine.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CLIENT", "install_client_probes", "install_worker_probes"]

CLIENT: dict[str, float] = {}
"""The driver's stamps for the sample in flight (cleared by the driver for each one)."""


def _wrap(
    owner: Any, name: str, before: str, after: str | None, stamp: Callable[[str], None]
) -> None:
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        stamp(before)
        try:
            return inner(*args, **kwargs)
        finally:
            if after is not None:
                stamp(after)

    setattr(owner, name, wrapper)


def _client_stamp(name: str) -> None:
    CLIENT.setdefault(name, time.time())


def install_client_probes(store: Any) -> None:
    """Stamp ``enqueue`` on ``store`` (the client's) and every publish of this process."""
    from dormant.celery.broker import Channel

    _wrap(store, "enqueue", "enqueue", "enqueued", _client_stamp)
    _wrap(Channel, "_put", "put", "pushed", _client_stamp)


_stamps: dict[str, dict[str, float]] = {}
_local = threading.local()
_read_at = [0.0]


def _worker_stamp(name: str) -> None:
    key = getattr(_local, "key", None)
    if key is not None:
        _stamps.setdefault(key, {}).setdefault(name, time.time())


def _task_key(args: Any, kwargs: Any) -> str | None:
    if kwargs and "thread_id" in kwargs:
        return str(kwargs["thread_id"])
    if args:
        return str(args[0])
    return None


def install_worker_probes(flush: Callable[[str, str], None]) -> None:
    """Wrap the worker's stages; ``flush(key, stamps_json)`` after each task."""
    import celery_app
    from celery import signals

    from dormant import tasks
    from dormant.celery.broker import Channel
    from dormant.runtime import slice as slice_module
    from dormant.runtime import watch
    from dormant.stores.redis import RedisLease
    from dormant.stores.sql.store import SQLStore

    inner_read = Channel._brpop_read

    def brpop_read(self: Any, **options: Any) -> Any:
        _read_at[0] = time.time()
        return inner_read(self, **options)

    Channel._brpop_read = brpop_read  # type: ignore[method-assign]

    def received(sender: Any = None, request: Any = None, **_: Any) -> None:
        key = _task_key(request.args, request.kwargs)
        if key is not None:
            _stamps[key] = {"read": _read_at[0], "received": time.time()}

    def prerun(args: Any = None, kwargs: Any = None, **_: Any) -> None:
        _local.key = _task_key(args, kwargs)
        _worker_stamp("prerun")

    def postrun(**_: Any) -> None:
        key = _local.key
        _local.key = None
        if key is not None and key in _stamps:
            flush(key, json.dumps(_stamps.pop(key)))

    signals.task_received.connect(received, weak=False)
    signals.task_prerun.connect(prerun, weak=False)
    signals.task_postrun.connect(postrun, weak=False)
    _wrap(tasks, "run_slice", "run_slice", None, _worker_stamp)
    _wrap(RedisLease, "acquire", "lease", "leased", _worker_stamp)
    _wrap(SQLStore, "load", "load", "loaded", _worker_stamp)
    _wrap(slice_module._Slice, "_converse", "converse", None, _worker_stamp)
    _wrap(watch, "complete_admitted", "admission", None, _worker_stamp)
    _wrap(celery_app.Timed, "complete", "model", None, _worker_stamp)
