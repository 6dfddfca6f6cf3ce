"""Callback URLs as capabilities: an HMAC over (thread_id, call_id, expiry) (DESIGN section 9).

The first key signs and every key verifies, so keys rotate by prepending a new one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from dormant.errors import InvalidToken

__all__ = [
    "APPROVAL_PATH",
    "STREAM_PATH",
    "approval_link",
    "callback_url",
    "link_keys",
    "parse_callback_url",
    "sign",
    "stream_keys",
    "stream_url",
    "verify",
    "verify_link",
]

STREAM_PATH = "/dormant/threads/{thread_id}/events"
"""Where ``dormant serve`` serves a thread's stream as Server-Sent Events."""
APPROVAL_PATH = "/dormant/approvals/{thread_id}/{call_id}/{decision}"
"""Where ``dormant serve`` answers a one-click approval link (``http/approval_links.py``)."""


def _mac(key: str, thread_id: str, call_id: str, expires_at_s: int) -> str:
    message = f"{thread_id}\n{call_id}\n{expires_at_s}".encode()
    digest = hmac.new(key.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign(keys: Sequence[str], thread_id: str, call_id: str, expires_at_s: int) -> str:
    """A token for one call, valid until ``expires_at_s`` (Unix seconds)."""
    return f"{expires_at_s}.{_mac(keys[0], thread_id, call_id, expires_at_s)}"


def verify(keys: Sequence[str], token: str, thread_id: str, call_id: str, now_s: float) -> None:
    """Raise ``InvalidToken`` unless ``token`` was signed for this call and has not expired."""
    expiry, _, mac = token.partition(".")
    # ASCII digits only, and a sane length: int() refuses "²" and 5,000-digit strings.
    if not (expiry.isascii() and expiry.isdigit() and len(expiry) <= 15) or not mac:
        raise InvalidToken(f"malformed callback token for call {call_id!r} of thread {thread_id!r}")
    if not any(hmac.compare_digest(mac, _mac(k, thread_id, call_id, int(expiry))) for k in keys):
        raise InvalidToken(
            f"callback token does not match call {call_id!r} of thread {thread_id!r}"
        )
    if int(expiry) < now_s:
        raise InvalidToken(
            f"callback token for call {call_id!r} of thread {thread_id!r} has expired"
        )


def callback_url(
    base_url: str, keys: Sequence[str], thread_id: str, call_id: str, expires_at_s: int
) -> str:
    token = sign(keys, thread_id, call_id, expires_at_s)
    path = f"{quote(thread_id, safe='')}/{quote(call_id, safe='')}"
    return f"{base_url.rstrip('/')}/{path}?token={token}"


def parse_callback_url(url: str) -> tuple[str, str, str]:
    """(thread_id, call_id, token) from a callback URL; ``InvalidToken`` if it is not one."""
    parts = urlsplit(url)
    segments = [unquote(s) for s in parts.path.rstrip("/").split("/")]
    tokens = parse_qs(parts.query).get("token", [])
    if len(segments) < 2 or not segments[-1] or not segments[-2] or len(tokens) != 1:
        raise InvalidToken(f"not a dormant callback URL: {url!r}")
    return segments[-2], segments[-1], tokens[0]


def stream_keys(keys: Sequence[str]) -> list[str]:
    """The keys of stream read tokens: derived, so a callback token never reads a stream and
    a stream token never delivers a result."""
    return [f"stream-read:{key}" for key in keys]


def stream_url(base_url: str, keys: Sequence[str], thread_id: str, expires_at_s: int) -> str:
    """The SSE URL of ``thread_id``'s stream with a read token; ``base_url`` is the callback
    base (``.../dormant/callbacks``), whose server serves the stream too."""
    root = base_url.rstrip("/").removesuffix("/dormant/callbacks")
    token = sign(stream_keys(keys), thread_id, "", expires_at_s)
    path = STREAM_PATH.format(thread_id=quote(thread_id, safe=""))
    return f"{root}{path}?token={token}"


def link_keys(keys: Sequence[str]) -> list[str]:
    """The keys of approval links: derived, so a callback or stream token never decides and
    a link never delivers a result."""
    return [f"approval-link:{key}" for key in keys]


def _bound(call_id: str, decision: str, digest: str, by: str) -> str:
    """What a link's MAC covers besides the thread and the expiry: the call, the one
    decision it makes, the digest of the arguments it was made for, and who it is for."""
    return f"{call_id}\n{decision}\n{digest}\n{by}"


def approval_link(
    base_url: str,
    keys: Sequence[str],
    thread_id: str,
    call_id: str,
    decision: str,
    digest: str,
    by: str,
    expires_at_s: int,
) -> str:
    """A one-click link that makes ``decision`` on the call as ``by``, for the arguments of
    ``digest``, until ``expires_at_s``; ``base_url`` is the callback base, whose server
    (``dormant serve``) answers it."""
    root = base_url.rstrip("/").removesuffix("/dormant/callbacks")
    token = sign(link_keys(keys), thread_id, _bound(call_id, decision, digest, by), expires_at_s)
    path = APPROVAL_PATH.format(
        thread_id=quote(thread_id, safe=""),
        call_id=quote(call_id, safe=""),
        decision=quote(decision, safe=""),
    )
    return f"{root}{path}?{urlencode({'digest': digest, 'by': by, 'token': token})}"


def verify_link(
    keys: Sequence[str],
    token: str,
    thread_id: str,
    call_id: str,
    decision: str,
    digest: str,
    by: str,
    now_s: float,
) -> None:
    """Raise ``InvalidToken`` unless the link was signed for exactly this call, decision,
    digest and person, and has not expired."""
    verify(link_keys(keys), token, thread_id, _bound(call_id, decision, digest, by), now_s)
