"""The callback receiver over real HTTP: what a CI system or webhook sender sees."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx
import pytest

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.http.callbacks import callback_app
from dormant.messages import EventShown, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.settings import Settings

urls: dict[str, str] = {}


@tool(deferred=True)
def build(target: str, ctx: ToolContext) -> None:
    """Start a build."""
    urls["build"] = ctx.callback_url


@tool(subscription=True)
def watch(repo: str, ctx: ToolContext) -> str:
    """Watch a repository."""
    urls["watch"] = ctx.callback_url
    return "watching"


def script(items: list[object]) -> object:
    if isinstance(items[-1], UserText):
        return reply("", call("build", target="main"), call("watch", repo="r"))
    return reply("ok")


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served() -> Iterator[tuple[LocalSystem, str, str]]:
    agent = Agent("a", model=ScriptedModel(script), tools=[build, watch])  # type: ignore[arg-type]
    settings = Settings(max_message_bytes=2048, callback_base_url="http://placeholder/cb")
    with LocalSystem([agent], "memory://", settings=settings) as system:
        server: WSGIServer = make_server("127.0.0.1", 0, callback_app(system), handler_class=_Quiet)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{server.server_port}"
        thread_id = system.launch("a", "go")
        system.run_until_idle()
        yield system, thread_id, base
        server.shutdown()
        server.server_close()


def local(url: str, base: str) -> str:
    return url.replace("http://placeholder", base)


def test_a_json_result_is_queued_and_answers_the_call(served: tuple[LocalSystem, str, str]) -> None:
    system, thread_id, base = served
    answer = httpx.post(local(urls["build"], base), json={"result": "green", "message_id": "ci-1"})
    assert answer.status_code == 202 and answer.json()["message_id"] == "ci-1"
    again = httpx.post(local(urls["build"], base), json={"result": "green", "message_id": "ci-1"})
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    system.run_until_idle()
    assert [r.content for r in system.history(thread_id) if isinstance(r, ToolResult)][
        -1
    ] == "green"


def test_a_plain_text_body_is_the_result(served: tuple[LocalSystem, str, str]) -> None:
    system, thread_id, base = served
    answer = httpx.post(local(urls["build"], base), content=b"red: 3 failures")
    assert answer.status_code == 202
    system.run_until_idle()
    assert "red: 3 failures" in [
        r.content for r in system.history(thread_id) if isinstance(r, ToolResult)
    ]


def test_an_event_on_a_subscription_callback(served: tuple[LocalSystem, str, str]) -> None:
    system, thread_id, base = served
    body = {"result": "PR #1", "event": True, "associative": True}
    assert httpx.post(local(urls["watch"], base), json=body).status_code == 202
    httpx.post(local(urls["build"], base), json={"result": "green"})
    system.run_until_idle()
    assert any(
        isinstance(i, EventShown) and i.content == "PR #1" for i in system.history(thread_id)
    )


@pytest.mark.parametrize(
    ("mangle", "body", "status", "reason"),
    [
        (lambda u: u[:-2] + "xx", {"result": "x"}, 403, "does not match"),
        (lambda u: u.replace("token=", "tok="), {"result": "x"}, 403, "not a dormant callback"),
        (lambda u: u, {"no_result": 1}, 400, '"result" key'),
        (lambda u: u, "x" * 3000, 413, "the limit is 2048"),
    ],
    ids=["forged-token", "no-token", "malformed", "oversized"],
)
def test_bad_callbacks_are_refused_with_a_status_and_a_reason(
    served: tuple[LocalSystem, str, str], mangle: object, body: object, status: int, reason: str
) -> None:
    system, thread_id, base = served
    before = system.store.inbox(thread_id)
    url = mangle(local(urls["build"], base))  # type: ignore[operator]
    answer = httpx.post(url, json=body) if isinstance(body, dict) else httpx.post(url, content=body)
    assert answer.status_code == status and reason in answer.json()["error"]
    assert system.store.inbox(thread_id) == before


def test_a_malformed_json_body_is_refused(served: tuple[LocalSystem, str, str]) -> None:
    _, _, base = served
    answer = httpx.post(
        local(urls["build"], base), content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400 and "not JSON" in answer.json()["error"]


def test_a_body_that_is_not_utf8_is_refused_with_a_reason_not_a_server_error(
    served: tuple[LocalSystem, str, str],
) -> None:
    system, thread_id, base = served
    before = system.store.inbox(thread_id)
    answer = httpx.post(
        local(urls["build"], base),
        content=b"\xff\xfe\x00",
        headers={"Content-Type": "application/octet-stream"},
    )
    assert answer.status_code == 400 and "must be UTF-8" in answer.json()["error"]
    assert system.store.inbox(thread_id) == before


def test_a_thread_id_holding_a_percent_sign_reaches_its_thread(
    served: tuple[LocalSystem, str, str],
) -> None:
    """The server has decoded the path once; the receiver must not decode it again."""
    system, _, base = served
    thread_id = system.launch("a", "go", thread_id="50%25 off")
    system.run_until_idle()
    assert "/50%2525%20off/" in urls["build"]
    answer = httpx.post(local(urls["build"], base), json={"result": "built", "message_id": "p-1"})
    assert answer.status_code == 202, answer.text
    system.run_until_idle()
    assert [r.content for r in system.history(thread_id) if isinstance(r, ToolResult)][-1] == (
        "built"
    )


def test_a_result_for_a_pruned_thread_is_refused_with_404_and_the_reason(
    served: tuple[LocalSystem, str, str],
) -> None:
    from datetime import UTC, datetime, timedelta

    from dormant.ops.prune import prune
    from dormant.stores.base import ThreadStatus

    system, thread_id, base = served
    system.store.set_status(thread_id, ThreadStatus.CLOSED)
    assert prune(system.store, datetime.now(UTC) + timedelta(seconds=1)).threads == 1
    answer = httpx.post(local(urls["build"], base), json={"result": "green"})
    assert answer.status_code == 404
    assert "never created, or pruned" in answer.json()["error"]
