"""One-click approval links in ``dormant serve`` (``docs/approvals.md``).

A link (``BaseClient.approval_links``) is a capability like a callback URL: an HMAC, with
keys of its own, over the thread, the call, the one decision it makes, the digest of the
arguments it was made for, who it is for, and its expiry. A GET only shows a confirmation
page (mail scanners and chat previews follow links: they must decide nothing); the page's
button POSTs to the same URL, and only that decides, through the client's checks like any
channel (``channel="link"``). A forged, altered or expired link is refused (403) and logged;
a replayed one meets "already decided" (409), since the first decision wins.

``dormant callbacks``, the development server on the default callback base's port, answers
them too (``with_links``), so the links the default settings make lead somewhere.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote

from dormant.approvals import find_request
from dormant.base_client import BaseClient
from dormant.errors import DecisionRefused, InvalidToken, NotFound
from dormant.http.asgi import BodyTooLarge, Receive, Scope, Send, read_body
from dormant.http.callbacks import StartResponse, WSGIApp
from dormant.http.paths import sent_path
from dormant.http.tokens import verify_link
from dormant.http.ui.html import esc, json_block

__all__ = ["APPROVALS_PREFIX", "LinkReply", "answer_link", "serve_link", "with_links"]

APPROVALS_PREFIX = "/dormant/approvals/"
_DECISIONS = ("approve", "reject")
"""What a link may decide: an edit needs a form of its own (the dashboard)."""
_MAX_FORM_BYTES = 4096

log = logging.getLogger("dormant.approvals")


@dataclass(frozen=True)
class LinkReply:
    status: int
    html: str


async def serve_link(client: BaseClient, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one request to an approval link (GET: the page; POST: the decision)."""
    method: str = scope["method"]
    raw: bytes | None = scope.get("raw_path")
    path = raw.decode("latin-1").split("?", 1)[0] if raw else scope["path"]
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    form = ""
    if method == "POST":
        try:
            form = (await read_body(receive, _MAX_FORM_BYTES)).decode("utf-8", "replace")
        except BodyTooLarge:
            await _respond(send, _too_large)
            return
    reply = await asyncio.to_thread(answer_link, client, method, path, query, form)
    await _respond(send, reply)


def with_links(client: BaseClient, app: WSGIApp) -> WSGIApp:
    """``app`` with approval links answered beside it, on a WSGI server that owns every
    path (``dormant callbacks``)."""

    def routed(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = sent_path(environ)
        if not path.startswith(APPROVALS_PREFIX):
            return app(environ, start_response)
        method = str(environ.get("REQUEST_METHOD", ""))
        reply = _too_large
        length = str(environ.get("CONTENT_LENGTH") or "0")
        if length.isascii() and length.isdigit() and int(length) <= _MAX_FORM_BYTES:
            form = environ["wsgi.input"].read(int(length)) if method == "POST" else b""
            query = parse_qs(str(environ.get("QUERY_STRING", "")))
            reply = answer_link(client, method, path, query, form.decode("utf-8", "replace"))
        data = reply.html.encode()
        headers = [(k.decode(), v.decode()) for k, v in _HEADERS]
        status = f"{reply.status} {HTTPStatus(reply.status).phrase}"
        start_response(status, [*headers, ("Content-Length", str(len(data)))])
        return [data]

    return routed


def answer_link(
    client: BaseClient, method: str, path: str, query: dict[str, list[str]], form: str
) -> LinkReply:
    """The reply to ``method`` on an approval link (``path`` percent-encoded as sent)."""
    if method not in ("GET", "POST"):
        return LinkReply(405, _page("Not allowed", "<p>GET shows the page; POST decides.</p>"))
    segments = [unquote(s) for s in path[len(APPROVALS_PREFIX) :].split("/")]
    values = {k: v[0] for k, v in query.items() if len(v) == 1}
    if len(segments) != 3 or not all(segments) or {"digest", "by", "token"} - set(values):
        return LinkReply(404, _page("Not a link", "<p>This is not an approval link.</p>"))
    thread_id, call_id, decision = segments
    digest, by, token = values["digest"], values["by"], values["token"]
    try:
        if decision not in _DECISIONS:
            raise InvalidToken(f"approval links do not {decision!r}")
        verify_link(
            client.settings.secret_keys,
            token,
            thread_id,
            call_id,
            decision,
            digest,
            by,
            time.time(),
        )
    except InvalidToken:
        log.warning("refused an approval link for call %r of thread %r", call_id, thread_id)
        body = "<p>This link is not valid: forged, altered or expired.</p>"
        return LinkReply(403, _page("Invalid link", body))
    if method == "GET":
        return _confirmation(client, thread_id, call_id, decision, digest, by)
    reason = parse_qs(form).get("reason", [""])[0][:1000]
    try:
        if decision == "approve":
            client.approve(thread_id, call_id, by=by, digest=digest, reason=reason, channel="link")
        else:
            client.reject(thread_id, call_id, by=by, digest=digest, reason=reason, channel="link")
    except (DecisionRefused, NotFound) as error:
        return LinkReply(409, _page("Not decided", f"<p>{esc(error)}</p>"))
    done = "Approved" if decision == "approve" else "Rejected"
    return LinkReply(
        200, _page(done, f"<p>{done} call <code>{esc(call_id)}</code>. Thank you.</p>")
    )


def _confirmation(
    client: BaseClient, thread_id: str, call_id: str, decision: str, digest: str, by: str
) -> LinkReply:
    """The page a GET shows: what the call does, and the one button that decides."""
    try:
        request = find_request(client.store, thread_id, call_id)
    except NotFound:
        request = None
    if request is None:
        return LinkReply(404, _page("Unknown call", "<p>No such call awaits approval.</p>"))
    changed = (
        ""
        if request.digest == digest
        else (
            "<p><strong>The arguments changed since this link was made: it will be refused."
            "</strong></p>"
        )
    )
    reason = (
        '<p><label>Why (the agent reads it) <input name="reason" maxlength="1000"></label></p>'
        if decision == "reject"
        else ""
    )
    body = (
        f"<p>{esc(request.prompt)}</p>"
        f"<p>Tool <b>{esc(request.name)}</b>, call <code>{esc(call_id)}</code> of thread "
        f"<code>{esc(thread_id)}</code>, proposed by agent version "
        f"<code>{esc(request.code_version)}</code>:</p>{json_block(request.args)}"
        f'{changed}<form method="post">{reason}'
        f'<button type="submit">{esc(decision.title())} as {esc(by)}</button></form>'
    )
    return LinkReply(200, _page(f"{decision.title()} {request.name}?", body))


def _page(title: str, body: str) -> str:
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width">'
        f"<title>{esc(title)}</title></head><body><h1>{esc(title)}</h1>{body}</body></html>"
    )


_HEADERS = [
    (b"content-type", b"text/html; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"referrer-policy", b"no-referrer"),  # the token is in the URL
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"default-src 'none'; form-action 'self'"),
]


async def _respond(send: Send, reply: LinkReply) -> None:
    data = reply.html.encode()
    headers = [*_HEADERS, (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


_too_large = LinkReply(413, _page("Too large", "<p>The form is too large.</p>"))
