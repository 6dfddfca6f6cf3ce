"""Local HTTP servers that speak the OpenAI and Anthropic wire protocols, and a network guard.

A ``FakeProvider`` listens on 127.0.0.1 (an ephemeral port), answers each POST with the
next scripted ``Reply`` (JSON, or server-sent events exactly as the real API sends them,
optionally cut after N events to simulate a dropped stream) and records every request's
JSON body, so tests drive the real SDK clients and assert what they sent.

``no_external_network`` (a pytest fixture, autouse where it is imported) and
``local_network_only`` (the same as a context manager) make any connection or name lookup
for a non-local host fail, and fail the test.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

__all__ = [
    "SSE",
    "FakeProvider",
    "NonLocalConnection",
    "Recorded",
    "Reply",
    "anthropic_error",
    "anthropic_stream",
    "local_network_only",
    "no_external_network",
    "openai_error",
    "openai_stream",
]

# The network guard -----------------------------------------------------------------------


class NonLocalConnection(ConnectionRefusedError):
    """A test tried to reach a host other than this machine."""


_LOCAL_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


def _is_local(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if not isinstance(host, str) or host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@contextmanager
def local_network_only() -> Iterator[list[str]]:
    """Refuse connections and lookups for non-local hosts; fail the test if any was tried.

    Yields the list of refused attempts (``host:port``). Unix sockets are allowed.
    """
    attempts: list[str] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def check(address: Any) -> None:
        if isinstance(address, tuple) and not _is_local(address[0]):
            attempts.append(f"{address[0]}:{address[1]}")
            raise NonLocalConnection(f"tests may not connect to {address[0]}:{address[1]}")

    def connect(self: socket.socket, address: Any) -> None:
        check(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(address)
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None:
            check((host, port))
        return real_getaddrinfo(host, port, *args, **kwargs)

    socket.socket.connect = connect  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign,assignment]
    socket.getaddrinfo = getaddrinfo
    try:
        yield attempts
    finally:
        socket.socket.connect = real_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = real_connect_ex  # type: ignore[method-assign]
        socket.getaddrinfo = real_getaddrinfo
    if attempts:
        pytest.fail(f"the test tried to reach non-local hosts: {', '.join(attempts)}")


@pytest.fixture(autouse=True)
def no_external_network() -> Iterator[None]:
    """Every test where this is imported (a conftest: every test) stays on this machine."""
    with local_network_only():
        yield


# Scripted replies ------------------------------------------------------------------------


@dataclass(frozen=True)
class SSE:
    """One server-sent event: an optional ``event:`` line and one ``data:`` line."""

    data: str
    event: str | None = None

    def encode(self) -> bytes:
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {self.data}\n\n".encode()


@dataclass(frozen=True)
class Reply:
    """One scripted response: a JSON ``body``, or ``events`` streamed as SSE.

    ``cut_after`` sends only that many events; the body then ends cleanly (a stream
    missing its final event), or with ``abort`` the connection drops mid-body. ``stall``
    sends nothing until the server closes (for client timeouts).
    """

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    events: Sequence[SSE] = ()
    cut_after: int | None = None
    abort: bool = False
    stall: bool = False

    def cut(self, after: int | None = None, *, abort: bool = False) -> Reply:
        """This stream, cut after ``after`` events (default: half of them)."""
        count = len(self.events) // 2 if after is None else after
        return replace(self, cut_after=count, abort=abort)


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any


NO_REPLY_LEFT = Reply(418, body={"error": {"message": "fake server: no scripted reply left"}})


class FakeProvider:
    """A local server for one provider endpoint; use as a context manager."""

    def __init__(self, path: str, base_path: str = "") -> None:
        self.path = path
        self.requests: list[Recorded] = []
        self._replies: deque[Reply] = deque()
        self._fallback = NO_REPLY_LEFT
        self._lock = threading.Lock()
        self.closing = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{port}{base_path}"
        # A short poll interval: shutdown() waits for the serving loop's next poll.
        serve = lambda: self._server.serve_forever(poll_interval=0.01)  # noqa: E731
        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()

    @classmethod
    def openai(cls) -> FakeProvider:
        """``base_url`` is what ``OpenAIModel(base_url=...)`` takes (it ends in ``/v1``)."""
        return cls("/v1/chat/completions", base_path="/v1")

    @classmethod
    def anthropic(cls) -> FakeProvider:
        return cls("/v1/messages")

    def script(self, *replies: Reply) -> None:
        """Answer the next requests with ``replies``, in order."""
        with self._lock:
            self._replies.extend(replies)

    def repeat(self, reply: Reply | None) -> None:
        """Answer with ``reply`` once the script is spent (None: an error saying so)."""
        with self._lock:
            self._fallback = reply or NO_REPLY_LEFT

    @property
    def bodies(self) -> list[Any]:
        """The JSON body of every request received, in order."""
        with self._lock:
            return [r.body for r in self.requests]

    def take(self, request: Recorded) -> Reply:
        with self._lock:
            self.requests.append(request)
            if request.path != self.path:
                return Reply(404, body={"error": {"message": f"no route {request.path}"}})
            return self._replies.popleft() if self._replies else self._fallback

    def close(self) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> FakeProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeProvider


class _Handler(BaseHTTPRequestHandler):
    """Answers one request per connection, as HTTP/1.1 with chunked SSE bodies."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = json.loads(raw) if raw else None
        reply = self.server.fake.take(Recorded("POST", self.path, headers, body))
        self.close_connection = True
        if reply.stall:
            self.server.fake.closing.wait()
            return
        if reply.events:
            self._stream(reply)
        else:
            self._json(reply)

    def _json(self, reply: Reply) -> None:
        payload = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self._finish_headers(reply)
        self.wfile.write(payload)

    def _stream(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self._finish_headers(reply)
        count = len(reply.events) if reply.cut_after is None else reply.cut_after
        for sse in reply.events[:count]:
            data = sse.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        if reply.cut_after is not None and reply.abort:
            return  # the connection closes without the last chunk: a dropped stream
        self.wfile.write(b"0\r\n\r\n")

    def _finish_headers(self, reply: Reply) -> None:
        self.send_header("Connection", "close")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``FakeProvider.requests`` instead."""


# OpenAI wire -----------------------------------------------------------------------------

CallScript = tuple[str, str, Sequence[str]]
"""(call id, tool name, argument text in pieces)"""


def openai_stream(
    text: Sequence[str] = (),
    calls: Sequence[CallScript] = (),
    *,
    usage: tuple[int, int, int] = (12, 5, 0),
    interleave: bool = False,
    model: str = "gpt-test",
) -> Reply:
    """A Chat Completions stream: ``data: {chat.completion.chunk}`` lines, then ``[DONE]``.

    ``usage`` is (prompt_tokens, completion_tokens, cached_tokens), sent in a last chunk
    with no choices as ``stream_options.include_usage`` asks. ``interleave`` sends the
    argument pieces of parallel calls round-robin (deltas are joined by index).
    """

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> SSE:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        body = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [choice],
            "usage": None,
            **extra,
        }
        return SSE(json.dumps(body))

    events = [chunk({"role": "assistant", "content": "", "refusal": None})]
    events += [chunk({"content": piece}) for piece in text]
    for index, (call_id, name, _pieces) in enumerate(calls):
        head = {"index": index, "id": call_id, "type": "function"}
        head["function"] = {"name": name, "arguments": ""}
        events.append(chunk({"tool_calls": [head]}))
    pieces = [
        (rank, index, piece)
        for index, (_, _, parts) in enumerate(calls)
        for rank, piece in enumerate(parts)
    ]
    if interleave:
        pieces.sort(key=lambda p: p[0])  # stable: round-robin across the calls
    for _rank, index, piece in pieces:
        events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    events.append(chunk({}, "tool_calls" if calls else "stop"))
    prompt, completion, cached = usage
    usage_body = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }
    last = json.loads(chunk({}).data) | {"choices": [], "usage": usage_body}
    events += [SSE(json.dumps(last)), SSE("[DONE]")]
    return Reply(events=events)


def openai_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Reply:
    kind = "rate_limit_exceeded" if status == 429 else "invalid_request_error"
    error = {"message": message, "type": kind, "param": None, "code": None}
    return Reply(status, headers or {}, body={"error": error})


# Anthropic wire --------------------------------------------------------------------------


def anthropic_stream(
    text: Sequence[str] = (),
    calls: Sequence[CallScript] = (),
    *,
    usage: tuple[int, int, int, int] = (20, 7, 0, 0),
    model: str = "claude-test",
) -> Reply:
    """A Messages stream: message_start, content blocks (text_delta, input_json_delta),
    message_delta with the usage, message_stop; a ``ping`` after the start, as the API does.

    ``usage`` is (input_tokens, output_tokens, cache_read_input_tokens,
    cache_creation_input_tokens).
    """
    input_tokens, output_tokens, cache_read, cache_creation = usage

    def event(name: str, **body: Any) -> SSE:
        return SSE(json.dumps({"type": name, **body}), event=name)

    message: dict[str, Any] = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "cache_creation_input_tokens": cache_creation,
            "cache_read_input_tokens": cache_read,
            "output_tokens": 1,
        },
    }
    events = [event("message_start", message=message), event("ping")]
    index = 0
    if text:
        events.append(
            event("content_block_start", index=0, content_block={"type": "text", "text": ""})
        )
        for piece in text:
            events.append(
                event("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
            )
        events.append(event("content_block_stop", index=0))
        index = 1
    for offset, (call_id, name, pieces) in enumerate(calls):
        at = index + offset
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        events.append(event("content_block_start", index=at, content_block=block))
        for piece in ["", *pieces]:
            delta = {"type": "input_json_delta", "partial_json": piece}
            events.append(event("content_block_delta", index=at, delta=delta))
        events.append(event("content_block_stop", index=at))
    stop = {"stop_reason": "tool_use" if calls else "end_turn", "stop_sequence": None}
    events.append(event("message_delta", delta=stop, usage={"output_tokens": output_tokens}))
    events.append(event("message_stop"))
    return Reply(events=events)


def anthropic_error(
    status: int, kind: str, message: str, headers: Mapping[str, str] | None = None
) -> Reply:
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"}
    return Reply(status, headers or {}, body=body)
