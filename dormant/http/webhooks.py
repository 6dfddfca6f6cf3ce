"""Webhooks: signed deliveries from a named source become events on a subscription call.

Routing is the callback URL's: ``POST {mount}/{source}/{thread_id}/{call_id}?token=...``.
A subscription tool turns its ``ctx.callback_url`` into a webhook URL with
``webhook_url(ctx.callback_url, "github")`` and registers it with the sender (or prints it
for a human to paste). The URL names the subscription and carries dormant's token, so no
routing table is needed; the source's shared secret proves the sender. The token's expiry is
not checked here: a sender such as GitHub keeps one URL for as long as the hook exists, so
a webhook lives as long as its subscription; a cancelled subscription or a closed thread
refuses the delivery (409), and so does a rotated-out signing key (403).

Every refusal is a 4xx with a reason and changes nothing: unknown source (404), wrong
content type (415), oversized (413), missing or wrong signature (401), stale or malformed
timestamp (401), non-UTF-8, malformed or too deeply nested body (400), bad token (403),
replayed delivery id (409). An unreachable database or Redis is a 503 with a reason.
The receiver is framework-agnostic (``WebhookReceiver.receive`` takes the path as sent,
bytes and headers); ``dormant.serve`` runs it over ASGI, and
``flask_blueprint``/``django_view`` mount it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from dormant.base_client import BaseClient
from dormant.errors import (
    ConfigurationError,
    DormantError,
    DuplicateMessage,
    InvalidToken,
    MalformedMessage,
    MessageRejected,
    NotFound,
    PayloadTooLarge,
)
from dormant.http.outages import UNAVAILABLE_STATUS, unavailable_reason
from dormant.http.paths import sent_path, sent_tail
from dormant.http.tokens import parse_callback_url, verify

__all__ = [
    "WebhookReceiver",
    "WebhookReply",
    "WebhookSource",
    "django_view",
    "flask_blueprint",
    "github_source",
    "webhook_url",
]


@dataclass(frozen=True)
class WebhookSource:
    """One sender and how it signs: the defaults are GitHub's headers.

    ``secret_keys``: every key verifies (rotate by adding the new key, then removing the old
    one once the sender uses it). With ``timestamp_header`` set, the signature covers
    ``"{timestamp}." + body`` and a timestamp more than ``tolerance_s`` away is refused, so a
    captured request cannot be replayed later under a new delivery id. The timestamp is
    Unix seconds in decimal digits (a fraction allowed): ``nan``, ``inf`` or ``1e9``, which
    ``float`` would take, are refused, since ``nan`` is never "too far away".
    """

    name: str
    secret_keys: tuple[str, ...]
    signature_header: str = "X-Hub-Signature-256"
    signature_prefix: str = "sha256="
    delivery_header: str = "X-GitHub-Delivery"
    event_header: str | None = "X-GitHub-Event"
    timestamp_header: str | None = None
    tolerance_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.secret_keys or not all(self.secret_keys):
            raise ConfigurationError(f"webhook source {self.name!r} has no secret key")


def github_source(secret_keys: Iterable[str], name: str = "github") -> WebhookSource:
    """A source that verifies GitHub's ``X-Hub-Signature-256`` and dedups by delivery id."""
    return WebhookSource(name=name, secret_keys=tuple(secret_keys))


@dataclass(frozen=True)
class WebhookReply:
    """What the HTTP layer answers: a status code and a JSON body."""

    status: int
    body: dict[str, Any]


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


_STATUS: tuple[tuple[type[DormantError], int], ...] = (
    (InvalidToken, 403),
    (PayloadTooLarge, 413),
    (MalformedMessage, 400),
    (NotFound, 404),
    (MessageRejected, 409),
)


class WebhookReceiver:
    """Verifies deliveries and queues each as one event (message id = source:delivery)."""

    def __init__(
        self,
        client: BaseClient,
        sources: Iterable[WebhookSource],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.sources = {source.name: source for source in sources}
        self.clock = clock

    @property
    def max_body_bytes(self) -> int:
        return self.client.settings.max_message_bytes

    def receive(
        self, path: str, query: str, headers: Mapping[str, str], body: bytes
    ) -> WebhookReply:
        """Handle ``POST {mount}/{path}?{query}``; ``path`` is ``source/thread_id/call_id``
        as sent, still percent-encoded (``paths.py``): each segment is decoded once here."""
        lowered = {k.lower(): v for k, v in headers.items()}
        try:
            message_id = self._receive(path, query, lowered, body)
        except _Refused as refusal:
            return WebhookReply(refusal.status, {"error": str(refusal)})
        except DuplicateMessage as error:
            return WebhookReply(409, {"status": "duplicate", "error": str(error)})
        except DormantError as error:
            status = next((s for kind, s in _STATUS if isinstance(error, kind)), None)
            if status is None:
                return _unavailable(error)
            return WebhookReply(status, {"error": str(error)})
        except Exception as error:
            return _unavailable(error)
        return WebhookReply(202, {"status": "queued", "message_id": message_id})

    def _receive(self, path: str, query: str, headers: dict[str, str], body: bytes) -> str:
        segments = [unquote(s) for s in path.strip("/").split("/")]
        tokens = parse_qs(query).get("token", [])
        if len(segments) != 3 or not all(segments) or len(tokens) != 1:
            raise _Refused(404, f"not a webhook URL: /{path.strip('/')}?token=...")
        name, thread_id, call_id = segments
        source = self.sources.get(name)
        if source is None:
            raise _Refused(404, f"unknown webhook source {name!r}")
        if len(body) > self.max_body_bytes:
            raise PayloadTooLarge(
                f"webhook body is {len(body)} bytes; the limit is {self.max_body_bytes}"
            )
        if headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise _Refused(415, "webhook content type must be application/json")
        self._check_signature(source, headers, body)
        delivery = headers.get(source.delivery_header.lower(), "")
        if not delivery:
            raise _Refused(400, f"missing {source.delivery_header} header")
        verify(self.client.settings.secret_keys, tokens[0], thread_id, call_id, float("-inf"))
        kind = headers.get(source.event_header.lower()) if source.event_header else None
        content = _event_content(source.name, kind, delivery, body)
        return self.client.send_event(
            thread_id, call_id, content, message_id=f"{source.name}:{delivery}"
        )

    def _check_signature(self, source: WebhookSource, headers: dict[str, str], body: bytes) -> None:
        signed = body
        if source.timestamp_header is not None:
            stamp = headers.get(source.timestamp_header.lower(), "")
            if not _UNIX_SECONDS.fullmatch(stamp):
                raise _Refused(401, f"missing or bad {source.timestamp_header} header")
            if abs(self.clock() - float(stamp)) > source.tolerance_s:
                raise _Refused(
                    401, f"webhook timestamp is more than {source.tolerance_s:g} s away: expired"
                )
            signed = stamp.encode() + b"." + body
        given = headers.get(source.signature_header.lower(), "")
        if not given:
            raise _Refused(401, f"missing {source.signature_header} header")
        if not given.startswith(source.signature_prefix):
            form = f"{source.signature_prefix}<hex>"
            raise _Refused(401, f"{source.signature_header} must be {form}, not {given[:20]!r}")
        mac = given[len(source.signature_prefix) :]
        for key in source.secret_keys:
            expected = hmac.new(key.encode(), signed, hashlib.sha256).hexdigest()
            if hmac.compare_digest(mac, expected):
                return
        raise _Refused(401, f"{source.signature_header} does not match the body")


_UNIX_SECONDS = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")
"""A signed timestamp: decimal Unix seconds, at most a fraction; never nan or inf."""


def _event_content(source: str, kind: str | None, delivery: str, body: bytes) -> str:
    """The event the agent sees: the delivery's metadata and its JSON body, unchanged."""
    try:
        payload = json.loads(body.decode("utf-8"))
        return json.dumps(
            {"source": source, "event": kind, "delivery": delivery, "payload": payload}
        )
    except UnicodeDecodeError:
        raise _Refused(400, "webhook body is not UTF-8") from None
    except json.JSONDecodeError as error:
        raise _Refused(400, f"webhook body is not JSON: {error}") from None
    except RecursionError:
        # Deeper than the interpreter's stack allows (some hundreds of levels): a 400 with
        # the reason, not the server error an uncaught RecursionError becomes.
        raise _Refused(400, "webhook body is nested too deeply") from None
    except ValueError as error:  # an integer too long to convert
        raise _Refused(400, f"webhook body is not JSON dormant can read: {error}") from None


def _unavailable(error: Exception) -> WebhookReply:
    """503 for an unreachable database or Redis; anything else is a bug, raised."""
    reason = unavailable_reason(error)
    if reason is None:
        raise error
    return WebhookReply(UNAVAILABLE_STATUS, {"error": reason})


def webhook_url(callback_url: str, source: str) -> str:
    """The webhook URL of the subscription ``callback_url`` names, for ``source``.

    The callback base URL must end in ``/callbacks`` (``dormant serve`` mounts callbacks at
    ``/dormant/callbacks`` and webhooks beside them at ``/dormant/webhooks``).
    """
    thread_id, call_id, token = parse_callback_url(callback_url)
    parts = urlsplit(callback_url)
    head = parts.path.rstrip("/").rsplit("/", 2)[0]
    if not head.endswith("/callbacks"):
        raise ConfigurationError(
            f"callback URL {callback_url!r} is not under a /callbacks base; "
            "set DORMANT_CALLBACK_BASE_URL to https://<host>/dormant/callbacks"
        )
    base = head[: -len("callbacks")] + "webhooks"
    path = "/".join(quote(s, safe="") for s in (source, thread_id, call_id))
    return f"{parts.scheme}://{parts.netloc}{base}/{path}?token={token}"


def flask_blueprint(receiver: WebhookReceiver, name: str = "dormant_webhooks") -> Any:
    """A Flask blueprint: ``app.register_blueprint(bp, url_prefix="/dormant/webhooks")``."""
    from flask import Blueprint, request

    blueprint = Blueprint(name, __name__)

    @blueprint.post("/<path:path>")
    def webhook(path: str) -> tuple[dict[str, Any], int]:
        body = request.get_data(cache=False)
        query = request.query_string.decode("latin-1")
        sent = sent_tail(sent_path(request.environ), 3)  # ``path`` is decoded: see paths.py
        reply = receiver.receive(sent, query, dict(request.headers), body)
        return reply.body, reply.status

    return blueprint


def django_view(receiver: WebhookReceiver) -> Callable[..., Any]:
    """A Django view: ``re_path(r"^dormant/webhooks/(?P<path>.+)$", csrf_exempt(view))``."""

    def view(request: Any, path: str) -> Any:
        from django.http import JsonResponse

        if request.method != "POST":
            return JsonResponse({"error": "POST only"}, status=405)
        query = request.META.get("QUERY_STRING", "")
        sent = sent_tail(sent_path(request.META), 3)  # ``path`` is decoded: see paths.py
        reply = receiver.receive(sent, query, dict(request.headers), request.body)
        return JsonResponse(reply.body, status=reply.status)

    return view
