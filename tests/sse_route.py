"""The thread stream's SSE route for the in-process browser test of the examples' chat page.

It serves ``GET {prefix}{id}/events`` (``/dormant/threads/`` by default; ``Last-Event-ID``
or ``?after=``) as the stream contract says, straight from the client's own ``astream``:
the events, their ids and the resume are the real stream's; only the token check of
``dormant serve``'s route is left out (the tests' pages are served to this process's
browser alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, unquote

from dormant.base_client import BaseClient

PREFIX = "/dormant/threads/"
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


class SSERoute:
    def __init__(self, client: BaseClient, prefix: str = PREFIX) -> None:
        self.client = client
        self.prefix = prefix

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` with the stream's route in front of it."""

        async def routed(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
            path = scope.get("path", "")
            if (
                scope["type"] == "http"
                and path.startswith(self.prefix)
                and path.endswith("/events")
            ):
                await self.serve(scope, receive, send)
            else:
                await app(scope, receive, send)

        return routed

    async def serve(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        thread_id = unquote(scope["path"][len(self.prefix) : -len("/events")])
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        query = dict(parse_qsl(scope.get("query_string", b"").decode()))
        after = headers.get("last-event-id") or query.get("after") or None
        start = {"type": "http.response.start", "status": 200}
        start["headers"] = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-store"),
        ]
        await send(start)

        async def pump() -> None:
            async for event in self.client.astream(thread_id, after):
                data = json.dumps(event.model_dump(mode="json", exclude={"id", "type"}))
                body = f"id: {event.id}\nevent: {event.type}\ndata: {data}\n\n".encode()
                await send({"type": "http.response.body", "body": body, "more_body": True})

        async def gone() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        tasks = [asyncio.ensure_future(pump()), asyncio.ensure_future(gone())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await send({"type": "http.response.body", "body": b""})
