"""Beat sweeps itself: an idle deployment publishes nothing, yet every due timer and every
stranded thread still gets its wake, and sweeps stay on time behind a burst of queued tasks.

Real beat processes (``dormant beat``, and ``celery beat`` on a user's app with ``install``)
against a Redis broker whose lists the test reads: with no worker running, whatever beat
publishes stays in them. Sweeps are seen through the sweep turn's key, which holds when
each turn began.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from conftest import Deployment, Proc, scaled, wait_until

from dormant.messages import AssistantTurn
from dormant.stores.base import ThreadStatus
from dormant.worker import SLICE_TASK, broker_priority, celery_config

BEATS: dict[str, Callable[[Deployment], Proc]] = {
    "dormant beat": lambda d: d.start_cli("beat", "beat", "-l", "info"),
    # A Django or Flask project's own app, as docs/celery.md tells its users to run beat.
    "celery -A proj beat": lambda d: d._start(
        "beat", ["-A", "proj_app", "beat", "-S", "celery.beat:Scheduler", "-l", "info"], {}
    ),
}
NAP_S = 20.0
"""Long enough for a quiet window between the thread falling asleep and its timer."""


def queued(d: Deployment) -> list[dict[str, Any]]:
    """Every message waiting in this deployment's broker lists (every queue, every priority
    step), as ``{"task": ..., "thread_id": ...}``."""
    found = []
    for key in d.redis.scan_iter(match=f"{d.prefix}:broker:*", count=1000):
        if d.redis.type(key) != "list":
            continue
        for raw in d.redis.lrange(key, 0, -1):
            message = json.loads(raw)
            _, kwargs, _ = json.loads(base64.b64decode(message["body"]))
            found.append({"task": message["headers"]["task"], **kwargs})
    return found


def sweep_began_ms(d: Deployment) -> int | None:
    """When the running sweep turn began (beat's clock, epoch ms), while its key lives."""
    value = d.redis.get(f"{d.prefix}:sweep")
    return int(value) if value else None


def watch_sweeps(d: Deployment, window_s: float, each: Callable[[], None]) -> list[int]:
    """The start times of the sweeps seen over ``window_s`` of wall time, calling ``each``
    on every look. Absence of publishing can only be watched over a window."""
    seen: set[int] = set()
    ends = time.monotonic() + window_s
    while time.monotonic() < ends:
        d.check_alive()
        if (began := sweep_began_ms(d)) is not None:
            seen.add(began)
        each()
        time.sleep(0.05)
    return sorted(seen)


def wakes_for(d: Deployment, thread_id: str) -> list[dict[str, Any]]:
    return [m for m in queued(d) if m == {"task": SLICE_TASK, "thread_id": thread_id}]


@pytest.mark.parametrize("beat", list(BEATS))
def test_an_idle_fleet_leaves_every_queue_empty_yet_timers_and_stranded_threads_get_their_wake(
    deploy: Callable[..., Deployment], beat: str, own_database: str
) -> None:
    d = deploy(TEST_NAP_S=str(NAP_S), DORMANT_DATABASE_URL=own_database)
    worker = d.start_worker("w1")
    BEATS[beat](d)
    d.wait_ready(worker)
    client = d.client()
    sleeper = client.launch("napper", "nap")
    wait_until(
        lambda: [i.kind for i in client.history(sleeper)] == ["user", "assistant"],
        30,
        "the thread to fall asleep",
        check=d.check_alive,
    )
    # From the timer's own due time: on a busy machine the test may see the history well
    # after the slice set the timer, and a window counted from now would overlap its firing.
    due = client.store.next_timer_due()
    assert due is not None
    woke_at = time.monotonic() + (due - datetime.now(UTC)).total_seconds()
    d.expected_deaths.add(worker.name)
    worker.kill()  # the fleet scales to zero: from now on, what beat publishes stays queued
    assert queued(d) == []

    def nothing_published() -> None:
        assert queued(d) == [], "beat published while every thread slept"

    quiet_s = min(4.0, woke_at - time.monotonic() - 3.0)
    assert quiet_s >= 2.0, "the machine is too slow for the quiet window"
    sweeps = watch_sweeps(d, quiet_s, nothing_published)
    assert len(sweeps) >= 2, f"beat must sweep during the window (saw {sweeps})"

    # A thread whose wake the broker lost: only a sweep can send it again.
    stranded = client.launch("echo", "hello")
    wait_until(lambda: wakes_for(d, stranded), 10, "the launch's own wake", check=d.check_alive)
    for key in d.redis.scan_iter(match=f"{d.prefix}:broker:*", count=1000):
        if d.redis.type(key) == "list":
            d.redis.delete(key)
    wait_until(
        lambda: wakes_for(d, stranded),
        20,
        "beat's sweep to wake the stranded thread again",
        check=d.check_alive,
    )

    # The due timer: beat fires it and publishes its thread's wake.
    wait_until(
        lambda: wakes_for(d, sleeper),
        NAP_S + 20,
        "beat's sweep to fire the timer",
        check=d.check_alive,
        poll_s=0.2,
    )
    assert time.monotonic() >= woke_at - 1.0  # not before it was due

    # A worker started again runs both.
    d.wait_ready(d.start_worker("w2"))
    wait_until(
        lambda: (
            client.history(sleeper)[-1:] == [AssistantTurn(text="awake")]
            and client.history(stranded)[-1:] == [AssistantTurn(text="seen 1")]
        ),
        60,
        "the woken threads to finish",
        check=d.check_alive,
    )


BURST_TASKS = 3000
BURST_THREADS = 300


def test_beat_sweeps_on_time_while_the_queues_hold_a_burst_of_thousands_of_tasks(
    deploy: Callable[..., Deployment], own_database: str
) -> None:
    """With the production interval and wake-mark lifetime (2 s, 10 s) and no worker to
    drain them, 3,300 slice tasks wait in the queues; beat's sweeps keep their interval,
    and each re-wakes (at most 100) threads whose wakes are older than their marks."""
    d = deploy(
        DORMANT_SWEEP_INTERVAL_S="2",
        DORMANT_OUTBOX_GRACE_S="10",
        DORMANT_DATABASE_URL=own_database,
    )
    client = d.client()
    threads = [client.launch("echo", f"burst {n}") for n in range(BURST_THREADS)]
    app = Celery("burst", set_as_current=False)
    app.conf.update(celery_config(d.settings))
    with app.producer_or_acquire() as producer:
        for n in range(BURST_TASKS):
            app.send_task(
                SLICE_TASK,
                kwargs={"thread_id": f"burst-{n}"},
                queue="dormant.background",
                priority=broker_priority(app, 0),
                producer=producer,
            )
    app.close()
    assert len(queued(d)) == BURST_TASKS + BURST_THREADS

    d.start_cli("beat", "beat", "-l", "info")
    wait_until(lambda: sweep_began_ms(d), 60, "beat's first sweep", check=d.check_alive)
    sweeps = watch_sweeps(d, 16.0, lambda: None)  # past the marks' 10 s: re-wakes happen

    gaps_s = [(later - earlier) / 1000 for earlier, later in itertools.pairwise(sweeps)]
    print(
        f"\n{len(sweeps)} sweeps over 16 s behind {len(queued(d))} queued tasks;"
        f" gaps between sweep starts: longest {max(gaps_s):.2f} s, all {gaps_s}"
    )
    assert len(sweeps) >= 6, sweeps
    assert max(gaps_s) <= scaled(3.0), gaps_s  # the interval is 2 s
    rewoken = len(queued(d)) - BURST_TASKS - BURST_THREADS
    assert rewoken > 0  # threads whose wakes outlived their marks were woken again
    ours = {*threads, *(f"burst-{n}" for n in range(BURST_TASKS))}
    assert {m["thread_id"] for m in queued(d)} <= ours


def test_beat_closes_a_thread_idle_past_its_agents_limit(
    deploy: Callable[..., Deployment],
) -> None:
    """The sweep runs in beat, so beat enforces ``Agent(close_after_idle_s=...)``: it loads
    the agents (``DORMANT_AGENTS``) for their limits. A thread of an agent without a limit
    stays open."""
    d = deploy()
    worker = d.start_worker("w1")
    BEATS["dormant beat"](d)
    d.wait_ready(worker)
    client = d.client()
    forgotten = client.launch("forgetful", "hello")
    kept = client.launch("echo", "hello")
    wait_until(
        lambda: client.thread(forgotten).status is ThreadStatus.CLOSED,
        scaled(30),
        "beat to close the idle thread",
        check=d.check_alive,
    )
    closed = client.thread(forgotten)
    assert closed.closed_reason == "idle for more than 2 s"
    assert client.history(forgotten)[-1] == AssistantTurn(text="seen 1")
    assert client.thread(kept).status is ThreadStatus.IDLE


def test_dormant_beat_loads_the_agents_module_from_its_working_directory(
    deploy: Callable[..., Deployment], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/deploy.md runs every process where the agents module is (``/app``,
    ``/opt/dormant``), found there as ``celery -A`` finds it. ``dormant worker`` did;
    ``dormant beat`` logged "beat closes no idle threads: cannot import agents module" and
    left idle threads open for ever."""
    (tmp_path / "walk_cwd_agents.py").write_text("from celery_agents import echo, forgetful\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # this process's client, as the worker's
    d = deploy(DORMANT_AGENTS="walk_cwd_agents")
    path = os.pathsep.join([str(tmp_path), d.env["PYTHONPATH"]])
    worker = d.start_worker("w1", env={"PYTHONPATH": path})
    # The installed console script: unlike ``python -c``, it puts no directory of the
    # working one on the module path.
    dormant = str(Path(sys.executable).with_name("dormant"))
    beat = d._start("beat", [dormant, "beat", "-l", "info"], {}, module=False, cwd=tmp_path)
    d.wait_ready(worker)
    client = d.client()
    forgotten = client.launch("forgetful", "hello")
    wait_until(
        lambda: client.thread(forgotten).status is ThreadStatus.CLOSED,
        scaled(30),
        "beat, run in the agents module's directory, to close the idle thread",
        check=d.check_alive,
    )
    assert "closes no idle threads" not in beat.log_path.read_text()
