"""docs/upgrades.md's procedure, followed step by step on a fresh deployment of real
workers, through a rolling deploy of 200 threads.

The fleet starts on the old code (``deploy_old_agents``: ``triage`` v1, no ``scan``
tool, no ``ops`` agent) and 100 ``triage`` threads sleep after their first answer. Then,
as the page says: check the new code against the live threads, migrate, roll the workers
one at a time (each old one stopped cleanly, as Kubernetes and systemd stop them), watch
the drain, re-drive what stalled. Mid-roll the web app (deployed first) sends the sleeping
threads new work that needs the new tool, and launches 100 threads of the new agent.

Nothing may fail or be misreported: no call answered "not installed", no thread stalled,
every call one result, and every turn taken once the first new worker is up run by the
new code (each thread's version spans end in v2, and no v1 turn follows a v2 one).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import ROOT, Deployment, Proc, scaled, wait_until

from dormant.client import Client
from dormant.messages import AssistantTurn, ToolResult
from dormant.runtime.whereabouts import ROSTER_CACHE_S
from dormant.stores.base import ThreadStatus
from tests.databases import empty_database

SLEEPING = 100
"""``triage`` threads that sleep on the old code before the deploy."""
LAUNCHED = 100
"""``ops`` threads the web app launches mid-roll (the new agent)."""


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """A database with no tables: the deployment's first step creates them."""

    def unavailable(reason: str) -> None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is required in CI: {reason}")
        pytest.skip(reason)

    with empty_database("dormant_fresh", unavailable) as url:
        yield url


def dormant(d: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``dormant`` command, as an operator runs it against the deployment."""
    return subprocess.run(
        [sys.executable, "-m", "dormant", *args],
        env={**os.environ, **d.env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )


def stop_cleanly(d: Deployment, worker: Proc) -> None:
    """SIGTERM, Celery's warm shutdown: the worker finishes what it runs, then exits."""
    d.expected_deaths.add(worker.name)
    worker.popen.send_signal(signal.SIGTERM)
    worker.popen.wait(timeout=scaled(60))


def answered(client: Client, thread_id: str, text: str) -> bool:
    history = client.history(thread_id)
    last = history[-1] if history else None
    return isinstance(last, AssistantTurn) and not last.calls and last.text.startswith(text)


def versions(d: Deployment) -> dict[tuple[str, str], dict[str, Any]]:
    shown = dormant(d, "versions", "--json")
    assert shown.returncode == 0, shown.stderr
    return {(r["agent"], r["version"]): r for r in json.loads(shown.stdout)}


def test_the_upgrade_procedure_rolls_200_threads_with_nothing_failed(
    deploy: Callable[..., Deployment], fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_CELERY_LOGLEVEL", "info")  # the old workers' "left" lines
    d = deploy(
        DORMANT_DATABASE_URL=fresh_database,
        DORMANT_AGENTS="deploy_old_agents",
        DORMANT_ANNOUNCE_INTERVAL_S="1",
    )
    # A fresh deployment, as docs/deploy.md starts one: the schema first, then the fleet.
    migrated = dormant(d, "db", "upgrade")
    assert migrated.returncode == 0, migrated.stderr
    old = [d.start_worker(f"old{n}", concurrency=4) for n in (1, 2)]
    d.start_beat()
    d.wait_ready(*old)
    client = d.client()
    sleeping = [client.launch("triage", f"hello ({n})") for n in range(SLEEPING)]
    wait_until(
        lambda: all(answered(client, t, "old code: no scan") for t in sleeping),
        scaled(120),
        "the old code to answer the first turns",
        check=d.check_alive,
    )

    # 1. Check the new code against the live threads: nothing it could not run.
    checked = dormant(d, "check", "--upgrade", "--agents", "deploy_new_agents")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # 2. Migrate: already at the head here, and idempotent.
    assert dormant(d, "db", "upgrade").returncode == 0
    # 3. Roll the workers, one at a time; the web app, deployed first, sends new work.
    new_env = {"DORMANT_AGENTS": "deploy_new_agents"}
    new = [d.start_worker("new1", concurrency=4, env=new_env)]
    d.wait_ready(*new)
    wait_until(
        lambda: versions(d).get(("triage", "v2"), {}).get("live_workers"),
        scaled(30),
        "the first new worker to announce itself",
        check=d.check_alive,
    )
    # "Once it is up" is once the old workers' roster reads see it: each read serves
    # ROSTER_CACHE_S, so the work sent after that bound is the new code's alone.
    seen_at = time.monotonic()
    wait_until(lambda: time.monotonic() > seen_at + ROSTER_CACHE_S, 10, "roster reads to renew")
    for thread_id in sleeping:
        client.send(thread_id, "scan the api, please")
    ops = [client.launch("ops", f"deploy {n}") for n in range(LAUNCHED)]
    stop_cleanly(d, old[0])
    new.append(d.start_worker("new2", concurrency=4, env=new_env))
    d.wait_ready(new[1])
    stop_cleanly(d, old[1])

    # 4. Watch the drain: v1 has no live worker the moment the last old one stopped.
    drained = versions(d)
    assert drained["triage", "v1"]["live_workers"] == [], "a clean stop withdraws the card"
    assert len(drained["triage", "v2"]["live_workers"]) == 2
    wait_until(
        lambda: (
            all(answered(client, t, "new code: api: 0 findings") for t in sleeping)
            and all(answered(client, t, "new code: ops") for t in ops)
        ),
        scaled(180),
        "every thread to settle on the new code",
        check=d.check_alive,
    )
    after = versions(d)
    assert after["triage", "v2"]["open_threads"] == SLEEPING
    assert ("triage", "v1") not in after or after["triage", "v1"]["open_threads"] == 0
    # 5. Re-drive what stalled: nothing did.
    redriven = dormant(d, "retry", "--status", "stalled")
    assert redriven.returncode == 0, redriven.stderr
    assert redriven.stdout.strip() == "0 stalled thread(s) re-driven"

    for thread_id in sleeping:
        history = client.history(thread_id)
        results = [i for i in history if isinstance(i, ToolResult)]
        calls = [c for i in history if isinstance(i, AssistantTurn) for c in i.calls]
        assert [r.call_id for r in results] == [c.call_id for c in calls], thread_id
        assert [r.content for r in results] == ["api: 0 findings"], thread_id
        spans = [s.code_version for s in client.thread_versions(thread_id)]
        assert spans == ["v1", "v2"], (thread_id, spans)  # v1's first turn, then v2's only
        info = client.thread(thread_id)
        assert info.failures == 0 and info.status is ThreadStatus.IDLE, info
    for thread_id in ops:
        info = client.thread(thread_id)
        assert info.failures == 0 and not info.last_error and info.status is ThreadStatus.IDLE
    logs = d.logs()
    assert "not installed" not in logs and "Traceback" not in logs
    left = sum(w.log_path.read_text().count("left for another worker") for w in old)
    assert left > 0, "the old workers met the new work mid-roll and left it"
