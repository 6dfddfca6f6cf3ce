"""``dormant serve`` as a real process: a signed GitHub webhook drives an agent end to end.

The agent runs in this process (``LocalSystem`` on an SQLite file); ``dormant serve`` runs as
a subprocess on the same file, as it would beside workers on PostgreSQL. The server writes
the event to the inbox (and wakes through the broker, under a private Redis key prefix); the
LocalSystem's sweep finds the pending row and runs the slice. The outage test runs both on
a PostgreSQL database of its own, which it then makes refuse connections.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import redis
from sqlalchemy import text
from sqlalchemy.engine import make_url

from dormant import Agent, Client, LocalSystem, ToolContext, tool
from dormant.http.callbacks import callback_app
from dormant.http.dev_server import make_dev_server
from dormant.http.serve import asgi_app
from dormant.http.webhooks import WebhookReceiver, WebhookReply, webhook_url
from dormant.messages import EventShown, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.settings import Settings
from tests.databases import admin_engine, temporary_database

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


def serve_env(port: int, database_url: str, prefix: str) -> dict[str, str]:
    """What ``dormant serve`` needs: the database, the signing key, webhook secrets, and a
    broker (Redis) under a private key prefix."""
    return {
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


@contextmanager
def running_serve(env: dict[str, str], port: int, host: str = "127.0.0.1") -> Iterator[str]:
    """``dormant serve --host host`` as a subprocess, up; yields its base URL (always on
    127.0.0.1). Its log must hold no traceback, and its Redis keys are deleted afterwards."""
    server = subprocess.Popen(
        [sys.executable, "-m", "dormant", "serve", "--host", host, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_up(base, server, deadline_s=180.0)
        yield base
    finally:
        server.terminate()
        _, errors = server.communicate(timeout=30)
        assert b"Traceback" not in errors, errors.decode()
        conn = redis.Redis.from_url(REDIS_URL)
        keys = list(conn.scan_iter(match=f"{env['DORMANT_KEY_PREFIX']}*", count=1000))
        if keys:
            conn.delete(*keys)
        conn.close()


def watching(database_url: str, env: dict[str, str]) -> LocalSystem:
    """A LocalSystem on ``database_url`` (not yet entered) running the watcher agent."""
    agent = Agent("watcher", model=ScriptedModel(script), tools=[watch_pull_requests])  # type: ignore[arg-type]
    return LocalSystem([agent], database_url, settings=Settings.from_env(env))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalSystem, str, str]]:
    """One server for the module: starting a Python process is slow on a busy machine."""
    port = free_port()
    database_url = f"sqlite:///{tmp_path_factory.mktemp('serve') / 'dormant.db'}"
    env = serve_env(port, database_url, f"dserve{secrets.token_hex(5)}")
    with watching(database_url, env) as system:
        thread_id = system.launch("watcher", "watch acme/app")
        system.run_until_idle()
        with running_serve(env, port) as base:
            yield system, thread_id, base


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


def test_a_deeply_nested_signed_body_gets_a_json_400(served: tuple[LocalSystem, str, str]) -> None:
    """Correctly signed, but nested deeper than Python's JSON parser recurses: a 400 with
    the reason, not uvicorn's plain-text 500."""
    system, thread_id, _ = served
    before = system.store.inbox(thread_id)
    body = b"[" * 2000 + b"]" * 2000
    answer = github_post(urls["watch"], body, "deeply-nested-1")
    assert answer.status_code == 400, answer.text
    assert answer.json() == {"error": "webhook body is nested too deeply"}
    assert system.store.inbox(thread_id) == before


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(f"!!! PostgreSQL UNAVAILABLE, the receivers' outage test NOT RUN: {reason}")


@contextmanager
def refusing_connections(database_url: str) -> Iterator[None]:
    """The database stops accepting connections and loses the open ones: to its clients,
    an unreachable server. It accepts them again afterwards."""
    name = make_url(database_url).database
    admin = admin_engine()
    try:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                {"n": name},
            )
        yield
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()


def test_with_the_database_unreachable_webhooks_and_callbacks_get_a_json_503() -> None:
    """A sender must see a temporary failure it can retry, as JSON: the webhook and the
    callback routes of ``dormant serve`` (a real process), and the WSGI callback receiver
    under ``dormant callbacks``' server. The same delivery goes through once it is back."""
    unavailable = {"error": "the database is unavailable: try again later"}
    with temporary_database("dormant_serve_outage", _unavailable) as database_url:
        port = free_port()
        env = serve_env(port, database_url, f"dserve{secrets.token_hex(5)}")
        # The agent subscribes, then its LocalSystem closes: the outage is the receivers'.
        with watching(database_url, env) as system:
            system.launch("watcher", "watch acme/app")
            system.run_until_idle()
        hook = urls["watch"]
        callback = hook.replace("/webhooks/github/", "/callbacks/")
        event = {"result": "PR #5", "event": True, "message_id": "outage-cb"}
        body = json.dumps({"action": "opened", "number": 5}).encode()
        with Client.from_settings(Settings.from_env(env)) as client:
            wsgi = make_dev_server("127.0.0.1", 0, callback_app(client))
            threading.Thread(target=wsgi.serve_forever, daemon=True).start()
            direct = callback.replace(f"127.0.0.1:{port}", f"127.0.0.1:{wsgi.server_port}")
            try:
                with running_serve(env, port) as base:
                    with refusing_connections(database_url):
                        hooked = github_post(hook, body, "outage-1")
                        assert (hooked.status_code, hooked.json()) == (503, unavailable)
                        called = httpx.post(callback, json=event, timeout=30.0)
                        assert (called.status_code, called.json()) == (503, unavailable)
                        called = httpx.post(direct, json=event, timeout=30.0)
                        assert (called.status_code, called.json()) == (503, unavailable)
                        ready = httpx.get(f"{base}/readyz", timeout=30.0)
                        assert ready.status_code == 503
                        assert ready.json() == {
                            "status": "unavailable",
                            "error": "the database does not answer (OperationalError)",
                        }, "no host, database name or statement for anyone who asks"

                    deadline = time.monotonic() + 60.0
                    retried = github_post(hook, body, "outage-1")
                    while retried.status_code == 503 and time.monotonic() < deadline:
                        retried = github_post(hook, body, "outage-1")  # a sender's retry
                    assert retried.status_code == 202, retried.text
            finally:
                wsgi.shutdown()
                wsgi.server_close()


def test_dormant_serve_exits_3_with_one_line_on_a_configuration_error() -> None:
    """The README's exit code for a setting the deployment cannot run with."""
    base = serve_env(free_port(), "sqlite:///unused.db", "dserve-unused")
    for overrides, reason in [
        ({"DORMANT_SECRET_KEY": ""}, "DORMANT_SECRET_KEY is not set"),
        ({"DORMANT_WEBHOOK_SECRETS": "github"}, "DORMANT_WEBHOOK_SECRETS"),
    ]:
        ran = subprocess.run(
            [sys.executable, "-m", "dormant", "serve", "--port", str(free_port())],
            env={**base, **overrides},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 3, (overrides, ran.stderr)
        (line,) = ran.stderr.strip().splitlines()
        assert line.startswith("error: ") and reason in line, line


def test_a_bug_behind_a_route_is_a_json_500_and_its_traceback_stays_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(WebhookReceiver):
        def receive(self, *_: object) -> WebhookReply:
            raise RuntimeError("a bug with a secret in its message")

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=asgi_app(system, Broken(system, [])))
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as http:
            return await http.post("/dormant/webhooks/github/t/c?token=x", content=b"{}")

    settings = Settings(secret_keys=("k",))
    with LocalSystem([], "memory://", settings=settings) as system:
        answer = asyncio.run(post())
    assert answer.status_code == 500
    assert answer.json() == {"error": "internal error; the server log has the cause"}
    assert "secret" not in answer.text
    (record,) = [r for r in caplog.records if r.name == "dormant.serve"]
    assert record.exc_info is not None and "a bug with a secret" in str(record.exc_info[1])
