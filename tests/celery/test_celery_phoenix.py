"""dormant's traces in a real trace store: Arize Phoenix (from PyPI, ``make phoenix-env``)
started by the test, fed over OTLP/HTTP by real workers, read back from its REST API."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery_agents import shared_key

from tests.browser import free_port
from tests.celery.conftest import ROOT, Deployment, wait_until

PHOENIX = ROOT / "tests" / ".venv-phoenix" / "bin" / "phoenix"
PROJECT = "dormant"
"""The Phoenix project the workers' resource names (``openinference.project.name``)."""


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the Phoenix test needs its environment in CI: {reason}")
    pytest.skip(f"!!! PHOENIX UNAVAILABLE, the real trace store test NOT RUN: {reason}")


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Phoenix server of its own (SQLite in a temporary directory); its base URL."""
    if not PHOENIX.exists():
        _missing(f"no {PHOENIX} (make phoenix-env)")
    workdir = tmp_path_factory.mktemp("phoenix")
    port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log_path = workdir / "phoenix.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(PHOENIX), "serve"], env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"

    def alive() -> None:
        if proc.poll() is not None:
            pytest.fail(f"Phoenix exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")

    try:
        wait_until(lambda: _get(f"{url}/v1/projects") is not None, 120, "Phoenix", check=alive)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _stored_spans(url: str) -> list[dict[str, Any]]:
    found = _get(f"{url}/v1/projects/{PROJECT}/spans?limit=1000")
    return [] if found is None else list(found["data"])


def test_a_traced_turn_reaches_phoenix_over_otlp_as_one_trace(
    deploy: Callable[..., Deployment], phoenix: str
) -> None:
    d = deploy(DORMANT_AGENTS="tracing_agents", TEST_OTLP_ENDPOINT=f"{phoenix}/v1/traces")
    worker = d.start_worker("traced")
    d.wait_ready(worker)
    client = d.client()
    d.redis.rpush(shared_key(d.prefix, "gate"), "open")  # the first lookup goes at once
    thread_id = client.launch("traced", "what is k?")
    wait_until(
        lambda: client.thread(thread_id).status == "idle", 45, "the turn", check=d.check_alive
    )
    ours = ("invoke_agent", "chat", "execute_tool")
    stored = wait_until(
        lambda: (
            [s for s in _stored_spans(phoenix) if s["name"].startswith(ours)]
            if len(_stored_spans(phoenix)) >= 8
            else None
        ),
        30,
        "Phoenix to store the spans",
    )
    names = sorted(s["name"] for s in stored)
    assert names == sorted(
        ["invoke_agent traced"] * 3 + ["chat scripted"] * 3 + ["execute_tool gated_lookup"] * 2
    ), names
    assert len({s["context"]["trace_id"] for s in stored}) == 1
    ids = {s["context"]["span_id"] for s in stored}
    roots = [s for s in stored if not s.get("parent_id")]
    assert [r["name"] for r in roots] == ["invoke_agent traced"]
    assert all(s["parent_id"] in ids for s in stored if s is not roots[0])
    assert {s["attributes"]["gen_ai.conversation.id"] for s in stored} == {thread_id}
    chat = next(s for s in stored if s["name"] == "chat scripted")
    assert chat["attributes"]["gen_ai.operation.name"] == "chat"
    assert chat["attributes"]["gen_ai.usage.input_tokens"] == 10
    assert not any("gen_ai.input.messages" in s["attributes"] for s in stored)
