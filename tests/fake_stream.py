"""A stand-in for the thread event stream's SSE endpoint, for the dashboard's browser tests.

It speaks the stream contract (``GET /dormant/threads/{id}/events``, ``Last-Event-ID`` or
``?after=``, messages ``id:``/``event:``/``data:`` of types chunk, item, dispatched, status)
over a ``LocalSystem``'s live events, numbered from 1 as they are published. Only what was
published after it was attached is replayed: enough for pages that render the history
themselves and take only what is new from the stream.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from dormant.local import LocalSystem
from dormant.messages import Chunk, Event, ItemAdapter, ItemAdded, StatusChanged, ToolDispatched

PREFIX = "/dormant/threads/"
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


class FakeStream:
    def __init__(self, system: LocalSystem) -> None:
        self.lock = threading.Condition()
        self.log: dict[str, list[tuple[str, str]]] = {}
        system.on_event(self.record)

    def record(self, event: Event) -> None:
        match event:
            case Chunk(text=text):
                kind, data = "chunk", {"text": text}
            case ItemAdded(seq=seq, item=item):
                kind, data = (
                    "item",
                    {"seq": seq, "item": ItemAdapter.dump_python(item, mode="json")},
                )
            case ToolDispatched(call_id=call_id, name=name):
                kind, data = "dispatched", {"call_id": call_id, "name": name}
            case StatusChanged(status=status, detail=detail):
                kind, data = "status", {"status": status, "detail": detail or None}
            case _:
                return
        with self.lock:
            events = self.log.setdefault(event.thread_id, [])
            events.append((kind, json.dumps(data)))
            self.lock.notify_all()

    def after(self, thread_id: str, seen: int, timeout_s: float) -> list[tuple[str, str]]:
        with self.lock:
            self.lock.wait_for(lambda: len(self.log.get(thread_id, [])) > seen, timeout_s)
            return self.log.get(thread_id, [])[seen:]

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` with the stream's route in front of it."""

        async def routed(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
            path = scope.get("path", "")
            if scope["type"] == "http" and path.startswith(PREFIX) and path.endswith("/events"):
                await self.serve(scope, receive, send)
            else:
                await app(scope, receive, send)

        return routed

    async def serve(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        thread_id = scope["path"][len(PREFIX) : -len("/events")]
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        query = dict(parse_qsl(scope.get("query_string", b"").decode()))
        seen = int(headers.get("last-event-id") or query.get("after") or 0)
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        start = {"type": "http.response.start", "status": 200}
        start["headers"] = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-store"),
        ]
        await send(start)
        closed = False
        while not gone.is_set() and not closed:
            fresh = await asyncio.to_thread(self.after, thread_id, seen, 0.5)
            lines = []
            for kind, data in fresh:
                seen += 1
                lines.append(f"id: {seen}\nevent: {kind}\ndata: {data}\n\n")
                closed = closed or (kind == "status" and json.loads(data)["status"] == "closed")
            if lines:
                await send(
                    {
                        "type": "http.response.body",
                        "body": "".join(lines).encode(),
                        "more_body": True,
                    }
                )
        await send({"type": "http.response.body", "body": b""})
        watcher.cancel()
