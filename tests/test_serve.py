"""``dormant serve`` as a real process: a signed GitHub webhook drives an agent end to end.

The agent runs in this process (``LocalSystem`` on an SQLite file); ``dormant serve`` runs as
a subprocess on the same file, as it would beside workers on PostgreSQL. The server writes
the event to the inbox (and wakes through the broker, under a private Redis key prefix); the
LocalSystem's sweep finds the pending row and runs the slice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.http.webhooks import webhook_url
from dormant.messages import EventShown, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.settings import Settings

pytestmark = pytest.mark.timeout(400)  # the server's start is slow when the machine is busy

REDIS_URL = os.environ.get("DORMANT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
GITHUB_SECRET = "it's a secret to everybody"
urls: dict[str, str] = {}


@tool(subscription=True)
def watch_pull_requests(repo: str, ctx: ToolContext) -> str:
    """Watch a repository's pull requests."""
    urls["watch"] = webhook_url(ctx.callback_url, "github")
    return "watching"


def script(items: list[object]) -> object:
    if isinstance(items[-1], UserText):
        return reply("", call("watch_pull_requests", repo="acme/app"))
    return reply("noted")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until_up(base: str, server: subprocess.Popen[bytes], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert server.poll() is None, "dormant serve exited while starting"
        try:
            if httpx.get(f"{base}/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)  # not waiting for work: the port is not bound yet
    raise AssertionError(f"dormant serve did not answer /healthz within {deadline_s} s")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalSystem, str, str]]:
    """One server for the module: starting a Python process is slow on a busy machine."""
    port = free_port()
    database_url = f"sqlite:///{tmp_path_factory.mktemp('serve') / 'dormant.db'}"
    prefix = f"dserve{secrets.token_hex(5)}"
    env = {
        **os.environ,
        "DORMANT_DATABASE_URL": database_url,
        "DORMANT_SECRET_KEY": "dormant-key",
        "DORMANT_CALLBACK_BASE_URL": f"http://127.0.0.1:{port}/dormant/callbacks",
        "DORMANT_WEBHOOK_SECRETS": f"github={GITHUB_SECRET}",
        "DORMANT_REDIS_URL": REDIS_URL,
        "DORMANT_BROKER_URL": REDIS_URL,
        "DORMANT_KEY_PREFIX": prefix,
        "DORMANT_BROKER_KEY_PREFIX": f"{prefix}:broker:",
    }
    settings = Settings.from_env(env)
    agent = Agent("watcher", model=ScriptedModel(script), tools=[watch_pull_requests])  # type: ignore[arg-type]
    dormant = [sys.executable, "-m", "dormant"]
    with LocalSystem([agent], database_url, settings=settings) as system:
        thread_id = system.launch("watcher", "watch acme/app")
        system.run_until_idle()
        server = subprocess.Popen(
            [*dormant, "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_up(base, server, deadline_s=180.0)
            yield system, thread_id, base
        finally:
            server.terminate()
            _, errors = server.communicate(timeout=30)
            assert b"Traceback" not in errors, errors.decode()
            conn = redis.Redis.from_url(REDIS_URL)
            keys = list(conn.scan_iter(match=f"{prefix}*", count=1000))
            if keys:
                conn.delete(*keys)
            conn.close()


def github_post(url: str, body: bytes, delivery: str) -> httpx.Response:
    mac = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": f"sha256={mac}",
        "X-GitHub-Event": "pull_request",
        "X-GitHub-Delivery": delivery,
        "User-Agent": "GitHub-Hookshot/test",
    }
    return httpx.post(url, content=body, headers=headers, timeout=30.0)


def test_a_signed_github_webhook_over_http_wakes_the_subscribed_agent(
    served: tuple[LocalSystem, str, str],
) -> None:
    system, thread_id, base = served
    url = urls["watch"]
    assert url.startswith(f"{base}/dormant/webhooks/github/")
    body = json.dumps({"action": "opened", "pull_request": {"title": "Fix flaky build"}}).encode()
    answer = github_post(url, body, "72d3162e-cc78-11e3-81ab-4c9367dc0958")
    assert answer.status_code == 202, answer.text
    assert github_post(url, body, "72d3162e-cc78-11e3-81ab-4c9367dc0958").status_code == 409

    deadline = time.monotonic() + 60.0
    shown: list[EventShown] = []
    while not shown and time.monotonic() < deadline:
        system.run_until_idle(timeout_s=60.0)
        shown = [
            item
            for info in system.threads()
            for item in system.history(info.id)
            if isinstance(item, EventShown)
        ]
    assert len(shown) == 1, "the webhook never reached the agent"
    assert json.loads(shown[0].content)["payload"]["pull_request"]["title"] == "Fix flaky build"
    assert [row.message_id for row in system.store.inbox(thread_id)][-1].startswith("github:")


def test_the_server_refuses_a_forged_webhook_and_answers_probes(
    served: tuple[LocalSystem, str, str],
) -> None:
    system, thread_id, base = served
    before = system.store.inbox(thread_id)
    body = b'{"action": "opened"}'
    headers = {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": "sha256=" + "0" * 64,
        "X-GitHub-Delivery": "d-1",
    }
    forged = httpx.post(urls["watch"], content=body, headers=headers, timeout=30.0)
    assert forged.status_code == 401 and "does not match" in forged.json()["error"]
    huge = httpx.post(urls["watch"], content=b"x" * (300 * 1024), timeout=30.0)
    assert huge.status_code == 413
    assert httpx.get(f"{base}/readyz").json() == {"status": "ready"}
    assert httpx.get(f"{base}/nowhere").status_code == 404
    assert system.store.inbox(thread_id) == before


def test_the_server_serves_callback_urls_too(served: tuple[LocalSystem, str, str]) -> None:
    system, thread_id, _ = served
    callback = urls["watch"].replace("/webhooks/github/", "/callbacks/")
    event = {"result": "PR #2", "event": True, "message_id": "cb-1"}
    answer = httpx.post(callback, json=event, timeout=30.0)
    assert answer.status_code == 202 and answer.json()["message_id"] == "cb-1"
    assert any(row.message_id == "cb-1" for row in system.store.inbox(thread_id))


def test_ids_holding_a_slash_or_a_percent_sign_survive_the_server(
    served: tuple[LocalSystem, str, str],
) -> None:
    """The server routes on the path as sent: an encoded "/" in a thread id is not a separator."""
    system, _, _ = served
    thread_id = system.launch("watcher", "watch acme/app", thread_id="team/a%b")
    system.run_until_idle()
    assert "/team%2Fa%25b/" in urls["watch"]
    callback = urls["watch"].replace("/webhooks/github/", "/callbacks/")
    event = {"result": "PR #3", "event": True, "message_id": "slash-1"}
    answer = httpx.post(callback, json=event, timeout=30.0)
    assert answer.status_code == 202, answer.text
    assert any(row.message_id == "slash-1" for row in system.store.inbox(thread_id))
    body = json.dumps({"action": "opened", "number": 4}).encode()
    hooked = github_post(urls["watch"], body, delivery="slash-delivery")
    assert hooked.status_code == 202, hooked.text
