"""The operator commands against a real deployment: launch, send, deliver, callbacks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
from conftest import Deployment, wait_until
from typer.testing import CliRunner

from dormant.cli import app
from dormant.client import Client
from dormant.messages import UserText
from dormant.stores.base import CallRecord, CallState, Commit

runner = CliRunner()


def test_launch_send_and_deliver_from_the_command_line(deploy: Callable[..., Deployment]) -> None:
    d = deploy()
    worker = d.start_worker("w1", concurrency=2)
    d.wait_ready(worker)
    launched = runner.invoke(app, ["launch", "calc", "add 2 and 3"], env=d.env)
    assert launched.exit_code == 0, launched.output
    thread_id = launched.output.strip()
    client = d.client()
    sent = runner.invoke(app, ["send", thread_id, "and again", "--message-id", "m-2"], env=d.env)
    assert sent.exit_code == 0 and sent.output.strip() == "m-2"
    again = runner.invoke(app, ["send", thread_id, "and again", "--message-id", "m-2"], env=d.env)
    assert again.exit_code == 1 and "already received" in again.output
    wait_until(
        lambda: (
            [i.text for i in client.history(thread_id) if isinstance(i, UserText)]
            == ["add 2 and 3", "and again"]
        ),
        30,
        "both messages to be applied",
        check=d.check_alive,
    )
    unknown = runner.invoke(app, ["deliver", thread_id, "call_nope", "42"], env=d.env)
    assert unknown.exit_code == 1 and "never made call 'call_nope'" in unknown.output


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _pending_call(client: Client, thread_id: str) -> str:
    """Record a pending call ``call_x`` by hand, to call back for; its callback URL's path."""
    snap = client.store.load(thread_id)
    record = CallRecord("call_x", "add", {"a": 1, "b": 2}, 1, CallState.PENDING)
    commit = Commit(thread_id, snap.thread.version, snap.thread.status, 0, calls=[record])
    assert client.store.commit(commit) is not None
    return client.callback_url(thread_id, "call_x").split("/", 3)[3]


def _wait_listening(port: int) -> None:
    def listening() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/").status_code == 405
        except httpx.ConnectError:
            return False

    wait_until(listening, 20, "the callback server to listen")


def test_the_callback_server_receives_a_signed_callback(deploy: Callable[..., Deployment]) -> None:
    d = deploy()
    port = _free_port()
    env = {**os.environ, **d.env}
    server = subprocess.Popen(
        [sys.executable, "-m", "dormant.cli", "callbacks", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = d.client()
        thread_id = client.launch("calc", "hello")
        path = _pending_call(client, thread_id)
        _wait_listening(port)
        answer = httpx.post(f"http://127.0.0.1:{port}/{path}", json={"result": "3"})
        assert answer.status_code == 202, answer.text
        forged = httpx.post(f"http://127.0.0.1:{port}/{path[:-3]}xyz", json={"result": "4"})
        assert forged.status_code == 403
        contents = [getattr(r.message, "content", None) for r in client.store.inbox(thread_id)]
        assert contents.count("3") == 1 and "4" not in contents
    finally:
        server.kill()
        server.wait()


def test_the_callback_server_keeps_a_slash_and_a_percent_sign_inside_a_thread_id(
    deploy: Callable[..., Deployment], tmp_path: Path
) -> None:
    """wsgiref hands the app a decoded path, where an encoded "/" has become a separator:
    ``dormant callbacks`` reads the request target as sent, and logs it without the token."""
    d = deploy()
    port = _free_port()
    log_path = tmp_path / "callbacks.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "dormant.cli", "callbacks", "--port", str(port)],
            env={**os.environ, **d.env},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        client = d.client()
        thread_id = client.launch("calc", "hello", thread_id="team/a%41b")
        path = _pending_call(client, thread_id)
        assert "/team%2Fa%2541b/call_x?token=" in path
        _wait_listening(port)
        answer = httpx.post(f"http://127.0.0.1:{port}/{path}", json={"result": "3"})
        assert answer.status_code == 202, answer.text
        contents = [getattr(r.message, "content", None) for r in client.store.inbox(thread_id)]
        assert contents.count("3") == 1
        # the server logs a request after it answers it: wait for the line, then stop it
        line = '/team%2Fa%2541b/call_x" 202'
        wait_until(lambda: line in log_path.read_text(), 30, "the server to log the request")
    finally:
        server.kill()
        server.wait()
    logged = log_path.read_text()
    assert "token=" not in logged, logged


def test_dormant_close_closes_a_thread_keeps_the_reason_and_refuses_what_follows(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy()  # no worker: closing needs none, and the launch message stays queued
    thread_id = d.client().launch("echo", "hello")

    closed = runner.invoke(app, ["close", thread_id, "--reason", "spam"], env=d.env)
    assert closed.exit_code == 0, closed.output
    assert closed.output.strip() == f"thread {thread_id} is closed: spam"
    again = runner.invoke(app, ["close", thread_id, "--reason", "other"], env=d.env)
    assert again.exit_code == 0 and again.output.strip().endswith("closed: spam")
    shown = runner.invoke(app, ["show", thread_id, "--json"], env=d.env)
    record = json.loads(shown.output)["thread"]
    assert record["status"] == "closed" and record["closed_reason"] == "spam"
    listed = runner.invoke(app, ["threads"], env=d.env)
    assert "(spam)" in listed.output
    refused = runner.invoke(app, ["send", thread_id, "hello?"], env=d.env)
    assert refused.exit_code == 1 and "is closed (spam)" in refused.output
    unknown = runner.invoke(app, ["close", "thr_nope"], env=d.env)
    assert unknown.exit_code == 1
