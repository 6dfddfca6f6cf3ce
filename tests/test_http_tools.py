"""HTTP tools against a real local HTTP server: the protocol, retries and every failure."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import BaseModel

from dormant import Agent, LocalSystem
from dormant.messages import AssistantTurn, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.tools import http_tool


class BuildArgs(BaseModel):
    target: str


@dataclass
class Endpoint:
    """A scripted HTTP endpoint: answers (status, body) in turn, then the last one forever."""

    answers: list[tuple[int, str]]
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    state = Endpoint(answers=[(202, "{}")])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            state.requests.append(json.loads(self.rfile.read(length)))
            state.headers.append(dict(self.headers))
            status, body = state.answers.pop(0) if len(state.answers) > 1 else state.answers[0]
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_port}/builds"
    yield state
    server.shutdown()
    server.server_close()


def run(tool_url: str, *, deferred: bool, **options: Any) -> tuple[LocalSystem, str]:
    tool = http_tool(
        "run_build",
        tool_url,
        description="Start a CI build.",
        arguments=BuildArgs,
        deferred=deferred,
        sleep=lambda _s: None,
        **options,
    )

    def script(items: list[object]) -> object:
        if isinstance(items[-1], UserText):
            return reply("", call("run_build", "c1", target="main"))
        return reply("done")

    system = LocalSystem([Agent("a", model=ScriptedModel(script), tools=[tool])], "memory://")  # type: ignore[arg-type]
    thread_id = system.launch("a", "build main")
    system.run_until_idle()
    return system, thread_id


def result(system: LocalSystem, thread_id: str) -> ToolResult | None:
    return next((i for i in system.history(thread_id) if isinstance(i, ToolResult)), None)


def test_a_deferred_http_tool_posts_the_call_and_its_result_comes_back_by_callback(
    endpoint: Endpoint,
) -> None:
    system, thread_id = run(endpoint.url, deferred=True)
    with system:
        (sent,) = endpoint.requests
        assert sent["tool"] == "run_build" and sent["arguments"] == {"target": "main"}
        assert sent["thread_id"] == thread_id and sent["call_id"] == "c1"
        assert endpoint.headers[0]["Idempotency-Key"] == "c1"
        assert result(system, thread_id) is None  # accepted; the result is still to come
        system.deliver_callback(sent["callback_url"], "green")
        system.run_until_idle()
        assert result(system, thread_id) == ToolResult(
            call_id="c1", name="run_build", content="green"
        )


def test_a_direct_http_tools_response_is_its_result(endpoint: Endpoint) -> None:
    endpoint.answers = [(200, '{"result": "build 7 queued"}')]
    system, thread_id = run(endpoint.url, deferred=False)
    with system:
        answer = result(system, thread_id)
        assert answer is not None and answer.content == "build 7 queued" and not answer.is_error


def test_server_errors_are_retried_with_the_same_idempotency_key(endpoint: Endpoint) -> None:
    endpoint.answers = [(503, "busy"), (500, "oops"), (200, '{"result": "ok"}')]
    system, thread_id = run(endpoint.url, deferred=False, attempts=3)
    with system:
        assert result(system, thread_id) == ToolResult(call_id="c1", name="run_build", content="ok")
        assert [h["Idempotency-Key"] for h in endpoint.headers] == ["c1", "c1", "c1"]


@pytest.mark.parametrize(
    ("answers", "attempts", "expected", "requests"),
    [
        ([(404, "no such pipeline")], 3, "answered 404: no such pipeline", 1),
        ([(500, "down")], 2, "answered 500: down (after 2 attempts)", 2),
    ],
    ids=["client-error-not-retried", "server-error-exhausted"],
)
def test_a_refusing_endpoint_becomes_an_error_result(
    endpoint: Endpoint, answers: list[tuple[int, str]], attempts: int, expected: str, requests: int
) -> None:
    endpoint.answers = answers
    system, thread_id = run(endpoint.url, deferred=True, attempts=attempts)
    with system:
        answer = result(system, thread_id)
        assert answer is not None and answer.is_error and expected in answer.content
        assert len(endpoint.requests) == requests


def test_an_unreachable_endpoint_becomes_an_error_result_not_a_hang() -> None:
    system, thread_id = run("http://127.0.0.1:9/nothing", deferred=True, attempts=2, timeout_s=2)
    with system:
        answer = result(system, thread_id)
        assert answer is not None and answer.is_error
        assert "could not be reached" in answer.content and "(after 2 attempts)" in answer.content


def test_an_oversized_http_tool_response_becomes_one_error_result(endpoint: Endpoint) -> None:
    endpoint.answers = [(200, json.dumps({"result": "r" * 300_000}))]
    system, thread_id = run(endpoint.url, deferred=False)
    with system:
        answer = result(system, thread_id)
        assert answer is not None and answer.is_error
        assert "is 300000 bytes; the limit is 262144 (max_message_bytes)" in answer.content
        assert len(endpoint.requests) == 1  # answered once; the endpoint is not called again
        assert system.history(thread_id)[-1] == AssistantTurn(text="done")
