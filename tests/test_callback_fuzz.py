"""The callback receiver never answers 5xx to bad input: senders retry 5xx forever.

Hypothesis throws malformed JSON, wrong types, huge and deeply nested bodies, bad
encodings, odd content types, methods, paths and idempotency keys at the WSGI app, on the
in-memory store and on PostgreSQL (whose text columns refuse what SQLite accepts). Each
answer must be a 2xx or 4xx with a JSON reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.http.callbacks import callback_app
from dormant.messages import UserText
from dormant.models import ScriptedModel, call, reply
from dormant.settings import Settings
from tests.databases import temporary_database

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


BASE = "http://placeholder/cb"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(f"!!! PostgreSQL UNAVAILABLE, callback fuzzing on PostgreSQL NOT RUN: {reason}")


@pytest.fixture(scope="module", params=["memory", "postgres"])
def receiver(request: pytest.FixtureRequest) -> Iterator[tuple[LocalSystem, Any]]:
    with contextlib.ExitStack() as stack:
        url = "memory://"
        if request.param == "postgres":  # a database of its own: other tests count rows
            url = stack.enter_context(temporary_database("dormant_fuzz", _unavailable))
        yield from _served(url)


def _served(url: str) -> Iterator[tuple[LocalSystem, Any]]:
    agent = Agent("a", model=ScriptedModel(script), tools=[build, watch])  # type: ignore[arg-type]
    config = Settings(max_message_bytes=64 * 1024, callback_base_url=BASE, secret_keys=("k",))
    with LocalSystem([agent], url, settings=config) as system:
        system.launch("a", "go")
        system.run_until_idle()
        yield system, callback_app(system)


def valid_path(name: str) -> tuple[str, str]:
    path, _, query = urls[name].removeprefix(BASE).partition("?")
    return "/cb" + path, query


latin1 = st.text(st.characters(max_codepoint=255), max_size=60)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
payloads = st.fixed_dictionaries(
    {},
    optional={
        "result": json_values,
        "message_id": json_values | st.text(max_size=300),
        "event": json_values,
        "final": json_values,
        "associative": json_values,
        "is_error": json_values,
    },
).map(lambda d: json.dumps(d).encode())
bodies = st.one_of(
    payloads,
    st.binary(max_size=300),
    st.text(max_size=200).map(str.encode),
    st.sampled_from(
        [
            b"\xff\xfe\x00",
            b"[" * 5000,
            b'{"result": ' + b"1" * 6000 + b"}",
            b'{"result": "' + b"x" * 70_000 + b'"}',
            b'{"result": "a\\u0000b", "message_id": "nul\\u0000id"}',
            b'{"result": "\\ud800"}',
            b"",
        ]
    ),
)
targets = st.one_of(
    st.sampled_from(["build", "watch"]).map(valid_path),
    st.tuples(latin1, latin1),
    st.sampled_from(["build", "watch"]).map(valid_path).map(lambda pq: (pq[0], pq[1][:-3])),
    st.sampled_from(
        [("//[::1/x/y", "token=1.a"), ("/cb/t/c", "token=%C2%B2.abc"), ("/cb/t/c", "token=9" * 9)]
    ),
)


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    method=st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "HEAD", "DELETE", "BREW"]),
    target=targets,
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/octet-stream", "", "json; x=\x7f"]
    )
    | latin1,
    body=bodies,
    length=st.one_of(st.none(), st.just("-5"), st.just("1" * 30), st.just("²"), latin1),
    key=st.none() | latin1 | st.text(min_size=150, max_size=400),
)
def test_no_callback_input_gets_a_server_error(
    receiver: tuple[LocalSystem, Any],
    method: str,
    target: tuple[str, str],
    content_type: str,
    body: bytes,
    length: str | None,
    key: str | None,
) -> None:
    _, app = receiver
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "PATH_INFO": target[0],
        "QUERY_STRING": target[1],
        "CONTENT_TYPE": content_type,
        "CONTENT_LENGTH": str(len(body)) if length is None else length,
        "wsgi.input": io.BytesIO(body),
    }
    if key is not None:
        environ["HTTP_IDEMPOTENCY_KEY"] = key
    answered: list[str] = []
    reply_body = b"".join(app(environ, lambda status, headers: answered.append(status)))
    [status] = answered
    assert status[0] in "24", (status, reply_body)
    assert set(json.loads(reply_body)) & {"error", "status"}
