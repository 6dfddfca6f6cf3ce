"""``Dashboard``: the thread dashboard as one function of a request, for any web framework.

Routes, below the dashboard's root (``/dormant/ui/`` in ``dormant serve``): ``GET`` the list
(``?status=&agent=&before=``), ``GET thread?id=`` a thread's page (``&full=1``: every stored
item), ``GET thread/state?id=`` (JSON: what the page's live view refreshes), ``POST
thread/retry`` and ``POST thread/close`` (only with actions enabled, CSRF checked), ``GET
approvals`` (the queue of calls held for a decision, ``?root=&agent=``) and ``POST
approvals/decide`` (approve, reject, edit: actions enabled, CSRF checked), ``GET
static/...``, and ``login``/``logout`` when a token guards it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import resources
from urllib.parse import quote

from dormant.base_client import BaseClient
from dormant.errors import (
    DecisionRefused,
    InvalidStreamId,
    MalformedMessage,
    NotFound,
    UnknownThread,
)
from dormant.http.stream import sse_response
from dormant.http.ui.approvals_page import approvals_body, decide_from_form
from dormant.http.ui.guard import CSRF_COOKIE, SESSION_COOKIE, SESSION_TTL_S, Csrf, TokenGate
from dormant.http.ui.html import esc, page
from dormant.http.ui.listing import ListQuery, list_body
from dormant.http.ui.replays import replays_body
from dormant.http.ui.thread_page import thread_body, thread_state
from dormant.stores.base import ThreadInfo, ThreadStatus

__all__ = ["Dashboard", "StreamUrl", "UIRequest", "UIResponse"]

log = logging.getLogger("dormant.ui")

StreamUrl = Callable[[str], "str | None"]
"""The URL a browser opens for a thread's live events (SSE), or None for no live view."""

_STATIC = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript"}
_HTML = "text/html; charset=utf-8"


@dataclass(frozen=True)
class UIRequest:
    """One request, as every framework can give it. ``path`` is below ``root``."""

    method: str
    path: str
    root: str
    query: Mapping[str, str] = field(default_factory=dict)
    form: Mapping[str, str] = field(default_factory=dict)
    cookies: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    """Lower-case names."""
    secure: bool = False
    client_host: str | None = None
    fresh_csrf: bool = False
    """Set by ``Dashboard``: the CSRF cookie was made for this response, which sets it."""


@dataclass(frozen=True)
class UIResponse:
    status: int
    body: bytes
    content_type: str = _HTML
    headers: tuple[tuple[str, str], ...] = ()
    stream: Iterator[bytes] | None = None
    """A body sent as it is produced (the live view's events), instead of ``body``."""


class Dashboard:
    """Pages over ``client``'s store. ``gate`` None: the host app authenticated the
    request; ``actions``: retry and close are offered (else the dashboard is read-only).

    The thread page's live view reads the thread's event stream at ``stream_url(thread_id)``;
    with ``live`` and no ``stream_url``, the dashboard serves that stream itself, behind the
    same auth, at ``thread/events?id=`` (a host app's mount: ``UIResponse.stream``)."""

    def __init__(
        self,
        client: BaseClient,
        *,
        actions: bool = False,
        gate: TokenGate | None = None,
        stream_url: StreamUrl | None = None,
        live: bool = False,
    ) -> None:
        self.client = client
        self.actions = actions
        self.gate = gate
        self.stream_url = stream_url
        self.live = live
        keys = client.settings.secret_keys
        self.csrf = Csrf(keys[0] if keys else Csrf.new_cookie() * 2)

    def handle(self, request: UIRequest) -> UIResponse:
        if not request.cookies.get(CSRF_COOKIE):
            cookies = {**request.cookies, CSRF_COOKIE: Csrf.new_cookie()}
            request = replace(request, cookies=cookies, fresh_csrf=True)
        path = request.path.strip("/")
        if path.startswith("static/") and request.method == "GET":
            return self._static(path.removeprefix("static/"))
        if path == "login":
            return self._login(request)
        if self.gate is not None and not self.gate.allows(
            request.cookies, request.headers, request.client_host
        ):
            if self.gate.token:
                return _redirect(request.root + "login")
            return _text(403, "the dashboard needs DORMANT_UI_TOKEN on this address")
        try:
            return self._route(request, path)
        except UnknownThread as error:
            return self._html(request, 404, "not found", f'<p class="alert">{esc(error)}</p>')
        except (MalformedMessage, NotFound, InvalidStreamId) as error:
            return self._html(request, 400, "bad request", f'<p class="alert">{esc(error)}</p>')

    def _route(self, request: UIRequest, path: str) -> UIResponse:
        now = datetime.now(UTC)
        if path == "" and request.method == "GET":
            query = ListQuery.parse(request.query)
            body = list_body(self.client.store, query, request.root, now)
            return self._html(request, 200, "threads", body)
        if path == "thread" and request.method == "GET":
            info = self.client.thread(request.query.get("id", ""))
            return self._thread(request, info, now)
        if path == "replays" and request.method == "GET":
            tag = request.query.get("tag", "")
            body = replays_body(self.client.store, tag, request.root, now, request.query)
            nav = f'<a href="{esc(request.root)}">threads</a> / replays {esc(tag)}'
            return self._html(request, 200, f"replays {tag}", body, nav)
        if path == "thread/state" and request.method == "GET":
            info = self.client.thread(request.query.get("id", ""))
            state = thread_state(self.client, info, root=request.root, now=now)
            headers = (("cache-control", "no-store"),)
            return UIResponse(200, json.dumps(state).encode(), "application/json", headers)
        if path == "thread/events" and request.method == "GET" and self.live:
            return self._events(request)
        if path in ("thread/retry", "thread/close") and request.method == "POST":
            return self._act(request, path.removeprefix("thread/"))
        if path == "approvals" and request.method == "GET":
            return self._approvals(request, now)
        if path == "approvals/decide" and request.method == "POST":
            return self._decide(request, now)
        if path == "logout" and request.method == "POST":
            return _redirect(request.root + "login", (SESSION_COOKIE, "", 0, request))
        return _text(404, f"no page {path!r}")

    def _events(self, request: UIRequest) -> UIResponse:
        after = request.headers.get("last-event-id") or request.query.get("after") or None
        sse = sse_response(self.client, request.query.get("id", ""), after)
        kind = dict(sse.headers).get("Content-Type", "text/event-stream")
        headers = tuple((k.lower(), v) for k, v in sse.headers if k.lower() != "content-type")
        return UIResponse(sse.status, b"", kind, headers, stream=sse.body)

    def _thread(self, request: UIRequest, info: ThreadInfo, now: datetime) -> UIResponse:
        if self.stream_url is not None:
            stream = self.stream_url(info.id)
        elif self.live:
            stream = f"{request.root}thread/events?id={quote(info.id, safe='')}"
        else:
            stream = None
        body = thread_body(
            self.client,
            info,
            root=request.root,
            now=now,
            full=request.query.get("full") == "1",
            actions=self._action_forms(request, info),
            stream_url=stream,
        )
        nav = (
            f'<a href="{esc(request.root)}">threads</a> / <span class="mono">{esc(info.id)}</span>'
        )
        return self._html(request, 200, info.id, body, nav)

    def _action_forms(self, request: UIRequest, info: ThreadInfo) -> str:
        if not self.actions:
            return '<p class="muted readonly">read-only (DORMANT_UI_ACTIONS=1 enables actions)</p>'
        csrf = f'<input type="hidden" name="csrf" value="{esc(self._csrf_token(request))}">'
        ident = f'<input type="hidden" name="id" value="{esc(info.id)}">'
        forms = []
        if info.status is ThreadStatus.STALLED or info.failures:
            forms.append(
                f'<form method="post" action="{esc(request.root)}thread/retry">{csrf}{ident}'
                '<button class="act retry" type="submit">retry</button></form>'
            )
        if info.status is not ThreadStatus.CLOSED:
            forms.append(
                f'<form method="post" action="{esc(request.root)}thread/close" '
                f'data-confirm="Close {esc(info.id)} and its children?">{csrf}{ident}'
                '<input name="reason" placeholder="reason" value="closed from the dashboard">'
                '<button class="act close" type="submit">close</button></form>'
            )
        return f'<div class="actions">{"".join(forms)}</div>' if forms else ""

    def _act(self, request: UIRequest, action: str) -> UIResponse:
        if not self.actions:
            return _text(403, "the dashboard is read-only (DORMANT_UI_ACTIONS=1 enables actions)")
        if not self.csrf.valid(
            request.cookies.get(CSRF_COOKIE, ""), request.form.get("csrf", ""), request.headers
        ):
            return _text(403, "CSRF check failed: reload the page and try again")
        thread_id = request.form.get("id", "")
        if action == "retry":
            self.client.retry(thread_id)
        else:
            reason = request.form.get("reason", "").strip() or "closed from the dashboard"
            self.client.close_thread(thread_id, reason=reason)
        log.info("dashboard: %s of thread %s", action, thread_id)
        return _redirect(f"{request.root}thread?id={quote(thread_id, safe='')}")

    def _approvals(
        self, request: UIRequest, now: datetime, status: int = 200, notice: str = ""
    ) -> UIResponse:
        body = approvals_body(
            self.client,
            root=request.root,
            now=now,
            csrf=self._csrf_token(request) if self.actions else None,
            root_id=request.query.get("root") or None,
            agent=request.query.get("agent") or None,
            notice=notice,
        )
        nav = f'<a href="{esc(request.root)}">threads</a> / approvals'
        return self._html(request, status, "approvals", body, nav)

    def _decide(self, request: UIRequest, now: datetime) -> UIResponse:
        if not self.actions:
            return _text(403, "the dashboard is read-only (DORMANT_UI_ACTIONS=1 enables actions)")
        if not self.csrf.valid(
            request.cookies.get(CSRF_COOKIE, ""), request.form.get("csrf", ""), request.headers
        ):
            return _text(403, "CSRF check failed: reload the page and try again")
        try:
            thread_id = decide_from_form(self.client, dict(request.form))
        except DecisionRefused as error:
            return self._approvals(request, now, 409, str(error))
        except MalformedMessage as error:
            return self._approvals(request, now, 400, str(error))
        log.info("dashboard: decision on thread %s", thread_id)
        return _redirect(f"{request.root}approvals")

    def _login(self, request: UIRequest) -> UIResponse:
        if self.gate is None or not self.gate.token:
            return _redirect(request.root)
        error = ""
        if request.method == "POST":
            mine = request.cookies.get(CSRF_COOKIE, "")
            if self.csrf.valid(mine, request.form.get("csrf", ""), request.headers):
                session = self.gate.login(request.form.get("token", ""))
                if session is not None:
                    cookie = (SESSION_COOKIE, session, SESSION_TTL_S, request)
                    return _redirect(request.root, cookie)
            error = '<p class="alert">That is not the dashboard token.</p>'
        csrf = esc(self._csrf_token(request))
        body = f"""<section class="login"><h1>dormant dashboard</h1>{error}
<form method="post" action="{esc(request.root)}login">
<input type="hidden" name="csrf" value="{csrf}">
<label>token <input type="password" name="token" autofocus required></label>
<button type="submit">log in</button></form>
<p class="muted">The token is the server's DORMANT_UI_TOKEN.</p></section>"""
        return self._html(request, 200, "log in", body)

    def _csrf_token(self, request: UIRequest) -> str:
        return self.csrf.token(request.cookies[CSRF_COOKIE])

    def _html(
        self, request: UIRequest, status: int, title: str, body: str, nav: str = ""
    ) -> UIResponse:
        html = page(title, body, root=request.root, nav=nav)
        headers = [
            ("cache-control", "no-store"),
            ("x-frame-options", "DENY"),
            ("referrer-policy", "same-origin"),
        ]
        if request.fresh_csrf:
            headers.append(_cookie(CSRF_COOKIE, request.cookies[CSRF_COOKIE], None, request))
        return UIResponse(status, html.encode(), _HTML, tuple(headers))

    def _static(self, name: str) -> UIResponse:
        if name not in _STATIC:
            return _text(404, f"no file {name!r}")
        data = resources.files("dormant.http.ui").joinpath("static", name).read_bytes()
        return UIResponse(200, data, _STATIC[name], (("cache-control", "max-age=300"),))


def _cookie(name: str, value: str, max_age_s: float | None, request: UIRequest) -> tuple[str, str]:
    parts = [f"{name}={value}", f"Path={request.root}", "HttpOnly", "SameSite=Strict"]
    if max_age_s is not None:
        parts.append(f"Max-Age={int(max_age_s)}")
    if request.secure:
        parts.append("Secure")
    return ("set-cookie", "; ".join(parts))


def _redirect(location: str, cookie: tuple[str, str, float, UIRequest] | None = None) -> UIResponse:
    headers = [("location", location)]
    if cookie is not None:
        headers.append(_cookie(*cookie))
    return UIResponse(303, b"", "text/plain; charset=utf-8", tuple(headers))


def _text(status: int, text: str) -> UIResponse:
    return UIResponse(status, text.encode(), "text/plain; charset=utf-8")
