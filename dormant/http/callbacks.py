"""A WSGI app that receives callback URLs: ``POST {mount}/{thread_id}/{call_id}?token=...``.

Mount it in any WSGI server, or under Django/Flask (``DispatcherMiddleware``). The body is
JSON ``{"result": ..., "message_id"?, "is_error"?, "event"?, "final"?, "associative"?}``
or plain text (the result). ``Idempotency-Key`` may carry the message id. A retried
delivery is answered 200 ``duplicate`` so the sender stops retrying; refusals get a
status and a reason, and nothing reaches the history. With the database or Redis
unreachable the answer is 503 with a JSON reason: the sender should try again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from dormant.base_client import BaseClient
from dormant.errors import (
    DuplicateMessage,
    InvalidToken,
    MalformedMessage,
    MessageRejected,
    NotFound,
    PayloadTooLarge,
)
from dormant.http.outages import UNAVAILABLE_STATUS, unavailable_reason
from dormant.http.paths import sent_path
from dormant.http.tokens import parse_callback_url
from dormant.tools.runner import as_text

__all__ = ["callback_app"]

MAX_MESSAGE_ID_CHARS = 200

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
        except Exception as error:
            reason = unavailable_reason(error)
            if reason is None:
                raise
            status = f"{UNAVAILABLE_STATUS} Service Unavailable"
            return _reply(start_response, status, {"error": reason})
        return _reply(
            start_response, "202 Accepted", {"status": "queued", "message_id": message_id}
        )

    return app


def _deliver(client: BaseClient, environ: dict[str, Any]) -> str:
    # One leading slash: "//host/..." would otherwise be read as a network location.
    path = "/" + sent_path(environ).lstrip("/")
    thread_id, call_id, token = parse_callback_url(f"{path}?{environ.get('QUERY_STRING', '')}")
    body = _body(environ, client.settings.max_message_bytes)
    message_id = _message_id(environ.get("HTTP_IDEMPOTENCY_KEY") or None, "Idempotency-Key")
    if "json" not in environ.get("CONTENT_TYPE", ""):
        return client.deliver(thread_id, call_id, _text(body), message_id=message_id, token=token)
    payload = _json(body)
    message_id = _message_id(payload.get("message_id"), "message_id") or message_id
    event, associative, final, is_error = (
        _flag(payload, name) for name in ("event", "associative", "final", "is_error")
    )
    result = _result(payload["result"])
    if event:
        client.verify_token(thread_id, call_id, token)
        return client.send_event(
            thread_id, call_id, result, associative=associative, final=final, message_id=message_id
        )
    return client.deliver(
        thread_id, call_id, result, message_id=message_id, token=token, is_error=is_error
    )


def _body(environ: dict[str, Any], limit_bytes: int) -> bytes:
    raw = environ.get("CONTENT_LENGTH") or "0"
    if not (raw.isascii() and raw.isdigit()):
        raise MalformedMessage(f"Content-Length {raw[:40]!r} is not a byte count")
    length = int(raw[:20])
    if len(raw) > 20 or length > limit_bytes:
        raise PayloadTooLarge(f"callback body is {raw[:40]} bytes; the limit is {limit_bytes}")
    data: bytes = environ["wsgi.input"].read(length)
    return data


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise MalformedMessage(
            f"a plain-text callback body must be UTF-8: {error}; send JSON "
            '({"result": ...}) with Content-Type: application/json for structured results'
        ) from None


def _json(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        # ValueError covers JSONDecodeError and integers too long to convert.
        raise MalformedMessage(f"callback body is not JSON: {str(error)[:200]}") from None
    if not isinstance(payload, dict) or "result" not in payload:
        raise MalformedMessage('callback body must be a JSON object with a "result" key')
    return payload


def _result(value: Any) -> str:
    try:
        return as_text(value)
    except (ValueError, RecursionError):
        raise MalformedMessage('"result" is nested too deeply to store') from None


def _flag(payload: dict[str, Any], name: str) -> bool:
    value = payload.get(name, False)
    if not isinstance(value, bool):
        raise MalformedMessage(f'"{name}" must be true or false, not {type(value).__name__}')
    return value


def _message_id(value: object, source: str) -> str | None:
    """A sender's idempotency key: a short printable string (it is a unique key in SQL)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MalformedMessage(f"{source} must be a string, not {type(value).__name__}")
    if len(value) > MAX_MESSAGE_ID_CHARS or not value.isprintable():
        raise MalformedMessage(
            f"{source} must be printable and at most {MAX_MESSAGE_ID_CHARS} characters"
        )
    return value


def _reply(start_response: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    )
    return [data]
