"""The ASGI types ``dormant serve``'s routes share, and reading a request body under a cap.

``dormant serve`` speaks plain ASGI (no framework): the receivers (``serve.py``), the
thread streams (``stream.py``) and the dashboard (``ui/asgi.py``) each answer their
prefix.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ASGIApp", "BodyTooLarge", "Receive", "Scope", "Send", "read_body"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyTooLarge(Exception):
    """The body passed its cap: nothing more of it was kept."""


async def read_body(receive: Receive, limit_bytes: int) -> bytes:
    """The whole request body (a sender that disconnects ends it early); raises
    ``BodyTooLarge`` as soon as it passes ``limit_bytes``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
