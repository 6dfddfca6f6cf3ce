"""The ASGI app of ``dormant serve``: callbacks, webhooks and health probes in one process.

Routes: ``POST /dormant/callbacks/{thread_id}/{call_id}?token=`` (the WSGI callback receiver
in ``dormant.callbacks``, run unchanged on a worker thread), ``POST
/dormant/webhooks/{source}/{thread_id}/{call_id}?token=`` (``dormant.webhooks``), ``GET
/dormant/threads/{thread_id}/events?token=`` (a thread's stream as Server-Sent Events,
``dormant.http.stream``), ``GET|POST /dormant/approvals/{thread_id}/{call_id}/{decision}?``
(one-click approval links, ``dormant.http.approval_links``: a GET shows, a POST decides),
``GET /healthz`` (the process answers), ``GET /readyz`` (the
database answers) and the thread dashboard under ``/dormant/ui/`` (``dormant/http/ui/``,
HTML, not JSON). Store calls
block, so every request is handled on a worker thread; the event loop only moves bytes.
Every answer is JSON: an unreachable database or Redis is a 503 (the receivers say so),
and a bug a 500 whose traceback goes to the log, not to the sender.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

from dormant.base_client import BaseClient
from dormant.http.approval_links import APPROVALS_PREFIX, serve_link
from dormant.http.asgi import ASGIApp, BodyTooLarge, Receive, Scope, Send, read_body
from dormant.http.callbacks import callback_app
from dormant.http.stream import THREADS_PREFIX, serve_stream
from dormant.http.ui.asgi import UI_PREFIX, serve_ui
from dormant.http.ui.dashboard import Dashboard
from dormant.http.webhooks import WebhookReceiver, WebhookReply

__all__ = ["CALLBACKS_PREFIX", "WEBHOOKS_PREFIX", "asgi_app"]

CALLBACKS_PREFIX = "/dormant/callbacks/"
WEBHOOKS_PREFIX = "/dormant/webhooks/"

log = logging.getLogger("dormant.serve")


def asgi_app(
    client: BaseClient, receiver: WebhookReceiver, dashboard: Dashboard | None = None
) -> ASGIApp:
    """One ASGI app over ``client`` (the callbacks) and ``receiver`` (the webhooks), with
    the thread dashboard at ``/dormant/ui/`` if ``dashboard`` is given."""
    callbacks = callback_app(client)
    limit_bytes = client.settings.max_message_bytes

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["path"].startswith(THREADS_PREFIX):  # a stream: sent as it happens
            await serve_stream(client, scope, receive, send)
            return
        if scope["path"].startswith(APPROVALS_PREFIX):  # one-click links: HTML pages
            await serve_link(client, scope, receive, send)
            return
        if dashboard is not None and scope["path"].startswith(UI_PREFIX.rstrip("/")):
            await serve_ui(dashboard, scope, receive, send)
            return
        try:
            reply = await route(scope, receive)
        except Exception:
            # A bug, not the sender's fault: logged with its traceback, answered in JSON
            # like every other reply (uvicorn's own 500 is plain text).
            log.exception("dormant serve failed on %s %s", scope["method"], scope["path"])
            reply = WebhookReply(500, {"error": "internal error; the server log has the cause"})
        await _send(send, reply)

    async def route(scope: Scope, receive: Receive) -> WebhookReply:
        path: str = scope["path"]
        method: str = scope["method"]
        if path == "/healthz" and method == "GET":
            return WebhookReply(200, {"status": "ok"})
        if path == "/readyz" and method == "GET":
            return await asyncio.to_thread(_ready, client)
        if not path.startswith((CALLBACKS_PREFIX, WEBHOOKS_PREFIX)):
            return WebhookReply(404, {"error": f"no route for {path}"})
        if method != "POST":
            return WebhookReply(405, {"error": "POST only"})
        try:
            body = await read_body(receive, limit_bytes)
        except BodyTooLarge:
            return WebhookReply(413, {"error": f"body is over the limit of {limit_bytes} bytes"})
        raw_path = _encoded_path(scope)
        query = scope.get("query_string", b"").decode("latin-1")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if path.startswith(WEBHOOKS_PREFIX):
            rest = raw_path[len(WEBHOOKS_PREFIX) :]
            return await asyncio.to_thread(receiver.receive, rest, query, headers, body)
        return await asyncio.to_thread(_wsgi, callbacks, raw_path, query, headers, body)

    return app


def _encoded_path(scope: Scope) -> str:
    """The path as sent, percent-encoded: ids in it may hold an encoded ``/`` or ``%``.

    ``scope["path"]`` is decoded; splitting or decoding it again would mangle such ids.
    """
    path: str = scope["path"]
    raw: bytes | None = scope.get("raw_path")
    encoded = raw.decode("latin-1").split("?", 1)[0] if raw else ""
    if not encoded.startswith((CALLBACKS_PREFIX, WEBHOOKS_PREFIX)):
        encoded = quote(path, safe="/")  # no raw path, or its prefix was itself encoded
    return encoded


def _ready(client: BaseClient) -> WebhookReply:
    """Anyone who can reach the port may ask: the answer names the failure's kind only;
    the driver's text (hosts, database names, the statement) goes to the log."""
    try:
        client.store.threads(None, 1)
    except Exception as error:  # any database failure means "not ready"
        log.warning("readyz: the database does not answer: %s", error)
        reason = f"the database does not answer ({type(error).__name__})"
        return WebhookReply(503, {"status": "unavailable", "error": reason})
    return WebhookReply(200, {"status": "ready"})


def _wsgi(
    app: Callable[..., Any], path: str, query: str, headers: dict[str, str], body: bytes
) -> WebhookReply:
    """Run the WSGI callback receiver for one buffered request."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": unquote(path, encoding="latin-1"),
        "RAW_URI": path,
        "QUERY_STRING": query,
        "CONTENT_LENGTH": str(len(body)),
        "CONTENT_TYPE": headers.get("content-type", ""),
        "wsgi.input": io.BytesIO(body),
    }
    for name, value in headers.items():
        key = "HTTP_" + name.upper().replace("-", "_")
        if key not in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
            environ[key] = value
    started: list[str] = []

    def start_response(status: str, _headers: list[tuple[str, str]]) -> None:
        started.append(status)

    data = b"".join(app(environ, start_response))
    return WebhookReply(int(started[0].split()[0]), json.loads(data))


async def _send(send: Send, reply: WebhookReply) -> None:
    data = json.dumps(reply.body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
