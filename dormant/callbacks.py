"""A WSGI app that receives callback URLs: ``POST {mount}/{thread_id}/{call_id}?token=...``.

Mount it in any WSGI server, or under Django/Flask (``DispatcherMiddleware``). The body is
JSON ``{"result": ..., "message_id"?, "is_error"?, "event"?, "final"?, "associative"?}``
or plain text (the result). ``Idempotency-Key`` may carry the message id. A retried
delivery is answered 200 ``duplicate`` so the sender stops retrying; refusals get a
status and a reason, and nothing reaches the history.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from dormant.client import BaseClient
from dormant.errors import (
    DuplicateMessage,
    InvalidToken,
    MalformedMessage,
    MessageRejected,
    NotFound,
    PayloadTooLarge,
)
from dormant.tokens import parse_callback_url

__all__ = ["callback_app"]

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_STATUS = {
    InvalidToken: "403 Forbidden",
    PayloadTooLarge: "413 Payload Too Large",
    MalformedMessage: "400 Bad Request",
    NotFound: "404 Not Found",
    MessageRejected: "409 Conflict",
}


def callback_app(client: BaseClient) -> WSGIApp:
    """The receiver for ``client``'s callback URLs (``LocalSystem`` or ``Client``)."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            return _reply(start_response, "405 Method Not Allowed", {"error": "POST only"})
        try:
            message_id = _deliver(client, environ)
        except DuplicateMessage as error:
            return _reply(start_response, "200 OK", {"status": "duplicate", "detail": str(error)})
        except (MessageRejected, NotFound) as error:
            status = next(s for kind, s in _STATUS.items() if isinstance(error, kind))
            return _reply(start_response, status, {"error": str(error)})
        return _reply(
            start_response, "202 Accepted", {"status": "queued", "message_id": message_id}
        )

    return app


def _deliver(client: BaseClient, environ: dict[str, Any]) -> str:
    path = environ.get("PATH_INFO", "")
    query = environ.get("QUERY_STRING", "")
    thread_id, call_id, token = parse_callback_url(f"{path}?{query}")
    body = _body(environ, client.settings.max_message_bytes)
    message_id = environ.get("HTTP_IDEMPOTENCY_KEY") or None
    if "json" not in environ.get("CONTENT_TYPE", ""):
        return client.deliver(thread_id, call_id, body.decode(), message_id=message_id, token=token)
    payload = _json(body)
    message_id = payload.get("message_id") or message_id
    if not isinstance(message_id, str | None):
        raise MalformedMessage("message_id must be a string")
    if payload.get("event"):
        client.verify_token(thread_id, call_id, token)
        return client.send_event(
            thread_id,
            call_id,
            payload.get("result"),
            associative=bool(payload.get("associative")),
            final=bool(payload.get("final")),
            message_id=message_id,
        )
    return client.deliver(
        thread_id,
        call_id,
        payload.get("result"),
        message_id=message_id,
        token=token,
        is_error=bool(payload.get("is_error")),
    )


def _body(environ: dict[str, Any], limit_bytes: int) -> bytes:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise MalformedMessage("Content-Length is not a number") from None
    if length > limit_bytes:
        raise PayloadTooLarge(f"callback body is {length} bytes; the limit is {limit_bytes}")
    data: bytes = environ["wsgi.input"].read(length)
    return data


def _json(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MalformedMessage(f"callback body is not JSON: {error}") from None
    if not isinstance(payload, dict) or "result" not in payload:
        raise MalformedMessage('callback body must be a JSON object with a "result" key')
    return payload


def _reply(start_response: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    )
    return [data]
