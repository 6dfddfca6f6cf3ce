"""A thread's stream as Server-Sent Events: ``GET /dormant/threads/{thread_id}/events``.

Each event is one SSE message, ``id:`` its stream id, ``event:`` its type, ``data:`` one line
of JSON (docs/streaming.md has the fields); a browser's ``EventSource`` resumes with the
``Last-Event-ID`` it saw, or a caller passes ``?after=``. A comment (``: ping``) goes out
after ``heartbeat_s`` of silence, so proxies keep the connection and a dead peer is found;
the response ends after the ``closed`` status.

``dormant serve`` authorises a read with ``?token=`` from ``client.stream_url`` (403 when
forged, altered or expired). ``sse_response`` gives the same body to a host app that checks
its own users (``dormant.contrib.flask``, ``dormant.contrib.django``). A connection holds the
reader's place and at most one read of the live log (``LIVE_KEEP`` entries) at a time; in
``dormant serve`` its wait holds no thread, so one process keeps hundreds open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import (
    AsyncGenerator,
    Iterator,
)
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

from dormant.base_client import BaseClient
from dormant.errors import InvalidStreamId, InvalidToken, UnknownThread
from dormant.http.asgi import Receive, Scope, Send
from dormant.http.tokens import stream_keys, verify
from dormant.runtime.stream import StreamReader
from dormant.streams import StreamEvent

__all__ = [
    "HEARTBEAT_S",
    "SSE_HEADERS",
    "THREADS_PREFIX",
    "SSEResponse",
    "serve_stream",
    "sse_message",
    "sse_response",
    "verify_stream_token",
]

THREADS_PREFIX = "/dormant/threads/"
HEARTBEAT_S = 15.0
SSE_HEADERS = [
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache, no-transform"),
    ("X-Accel-Buffering", "no"),  # nginx: pass each event on at once
]
_PING = b": ping\n\n"

log = logging.getLogger("dormant.serve")


def sse_message(event: StreamEvent) -> bytes:
    """One SSE message: ``id``, ``event`` (the type) and the other fields as one JSON line."""
    data = event.model_dump(mode="json", exclude={"id", "type"})
    line = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"id: {event.id}\nevent: {event.type}\ndata: {line}\n\n".encode()


def verify_stream_token(client: BaseClient, thread_id: str, token: str) -> None:
    """``InvalidToken`` unless ``token`` is a live read token for ``thread_id``'s stream."""
    keys = stream_keys(client.settings.secret_keys)
    verify(keys, token, thread_id, "", time.time())


@dataclass(frozen=True)
class SSEResponse:
    """What a WSGI framework needs to serve a stream: status, headers and the body."""

    body: Iterator[bytes]
    headers: list[tuple[str, str]]
    status: int = 200


def sse_response(
    client: BaseClient,
    thread_id: str,
    after: str | None = None,
    *,
    heartbeat_s: float = HEARTBEAT_S,
) -> SSEResponse:
    """The SSE body of ``thread_id``'s stream after ``after`` (a ``Last-Event-ID``), for a
    host app that authorised the reader itself. Raises ``UnknownThread`` and
    ``InvalidStreamId`` now, before the response starts.

    The body blocks a thread while it waits (WSGI servers give each request one).
    """
    reader = client.stream_reader(thread_id, after or None)
    reader.check()
    return SSEResponse(_body(reader, heartbeat_s), list(SSE_HEADERS))


def _body(reader: StreamReader, heartbeat_s: float) -> Iterator[bytes]:
    yield b"retry: 1000\n\n"  # EventSource: reconnect after a second
    quiet_since = time.monotonic()
    while not reader.done:
        wait_s = max(0.0, quiet_since + heartbeat_s - time.monotonic())
        events = reader.poll(wait_s)
        for event in events:
            yield sse_message(event)
        if events:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= heartbeat_s:
            yield _PING
            quiet_since = time.monotonic()


async def _abody(reader: StreamReader, heartbeat_s: float) -> AsyncGenerator[bytes, None]:
    yield b"retry: 1000\n\n"
    quiet_since = time.monotonic()
    while not reader.done:
        wait_s = max(0.0, quiet_since + heartbeat_s - time.monotonic())
        events = await reader.apoll(wait_s)
        for event in events:
            yield sse_message(event)
        if events:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= heartbeat_s:
            yield _PING
            quiet_since = time.monotonic()


def _thread_id(scope: Scope) -> str | None:
    """The thread id of ``/dormant/threads/{id}/events``, decoded once from the path as sent
    (an id may hold an encoded ``/``)."""
    raw: bytes | None = scope.get("raw_path")
    path = raw.decode("latin-1").split("?", 1)[0] if raw else str(scope["path"])
    if not path.startswith(THREADS_PREFIX) or not path.endswith("/events"):
        return None
    encoded = path[len(THREADS_PREFIX) : -len("/events")]
    if not encoded or "/" in encoded:
        return None
    return unquote(encoded)


async def serve_stream(client: BaseClient, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer ``GET /dormant/threads/{thread_id}/events?token=`` in ``dormant serve``."""
    thread_id = _thread_id(scope)
    if thread_id is None:
        await _reply(send, 404, {"error": f"no route for {scope['path']}"})
        return
    if scope["method"] != "GET":
        await _reply(send, 405, {"error": "GET only"})
        return
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    after = headers.get("last-event-id") or (query.get("after") or [None])[0]
    try:
        verify_stream_token(client, thread_id, (query.get("token") or [""])[0])
    except InvalidToken as error:
        log.warning("stream of thread %r refused: %s", thread_id, error)
        await _reply(send, 403, {"error": "invalid or expired stream token"})
        return
    try:
        reader = client.stream_reader(thread_id, after)
        await asyncio.to_thread(reader.check)
    except UnknownThread:
        await _reply(send, 404, {"error": f"unknown thread {thread_id!r}"})
        return
    except InvalidStreamId as error:
        await _reply(send, 400, {"error": str(error)})
        return
    # Any origin may read with a token (it is the capability; no cookie is involved), so a
    # page served elsewhere can open the stream with EventSource.
    headers_out = [*SSE_HEADERS, ("Access-Control-Allow-Origin", "*")]
    start = [(k.lower().encode(), v.encode()) for k, v in headers_out]
    await send({"type": "http.response.start", "status": 200, "headers": start})
    await _pump(_abody(reader, HEARTBEAT_S), receive, send)


async def _pump(body: AsyncGenerator[bytes, None], receive: Receive, send: Send) -> None:
    """Send ``body`` until it ends or the peer goes away (then stop reading at once)."""
    gone = asyncio.ensure_future(_disconnected(receive))
    chunks = aiter(body)
    step: asyncio.Future[bytes] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(chunks))
            await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
            if gone.done():
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await step
                return
            try:
                data = step.result()
            except StopAsyncIteration:
                break
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        gone.cancel()
        if step is not None and not step.done():  # cancelled mid-wait (a server stopping)
            step.cancel()
            with contextlib.suppress(BaseException):
                await step
        await body.aclose()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _reply(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
