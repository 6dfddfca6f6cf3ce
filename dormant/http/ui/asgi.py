"""The dashboard in ``dormant serve``: ``Dashboard`` behind an ASGI route at ``/dormant/ui/``."""

from __future__ import annotations

import asyncio
import logging
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl

from dormant.http.asgi import BodyTooLarge, Receive, Scope, Send, read_body
from dormant.http.ui.dashboard import Dashboard, UIRequest, UIResponse

__all__ = ["UI_PREFIX", "serve_ui"]

log = logging.getLogger("dormant.serve")

UI_PREFIX = "/dormant/ui/"
_FORM_LIMIT_BYTES = 64 * 1024


async def serve_ui(dashboard: Dashboard, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one HTTP request under ``UI_PREFIX`` (or the prefix without its slash)."""
    path: str = scope["path"]
    if path == UI_PREFIX.rstrip("/"):
        await _respond(send, UIResponse(308, b"", headers=(("location", UI_PREFIX),)))
        return
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    try:
        body = await read_body(receive, _FORM_LIMIT_BYTES) if scope["method"] == "POST" else b""
    except BodyTooLarge:
        await _respond(send, UIResponse(413, b"form too large", "text/plain"))
        return
    form = dict(parse_qsl(body.decode("utf-8", "replace"))) if body else {}
    request = UIRequest(
        method=scope["method"],
        path=path[len(UI_PREFIX) :],
        root=UI_PREFIX,
        query=dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"))),
        form=form,
        cookies=_cookies(headers.get("cookie", "")),
        headers=headers,
        secure=scope.get("scheme") == "https",
        client_host=(scope.get("client") or (None, None))[0],
    )
    try:
        response = await asyncio.to_thread(dashboard.handle, request)
    except Exception:  # a bug or an unreachable store: logged, answered without a traceback
        log.exception("dashboard failed on %s %s", scope["method"], path)
        response = UIResponse(500, b"dashboard error; the server log has the cause", "text/plain")
    await _respond(send, response)


def _cookies(raw: str) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw)
    except CookieError:
        return {}
    return {name: morsel.value for name, morsel in jar.items()}


async def _respond(send: Send, response: UIResponse) -> None:
    headers = [(b"content-type", response.content_type.encode())]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
