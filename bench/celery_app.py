"""The worker side of ``bench/celery_throughput.py``: its agents, and its baseline tasks.

A worker runs ``celery -A celery_app worker`` with ``bench/`` on ``PYTHONPATH`` and the
bench's ``DORMANT_*`` settings; ``app`` is built on first access. Agents:

- ``chat``: one 1,200-character streamed completion per slice, no tool call;
- ``waiter``: every user message is answered with a call to the deferred tool
  ``wait_build``, whose (thread, call, time) is pushed to a Redis list for the driver to
  answer with ``Client.deliver``; the answer gets a second completion.

Every model call stamps its start time in a Redis hash (by thread): the wake-up latency's
end. Baseline tasks on the same app: ``bench.noop`` (stamps its start) and
``bench.blocking_agent`` (a completion, a blocking ``sleep`` standing for the tool, a
second completion: how an agent loop on plain Celery waits).
"""

from __future__ import annotations

import json
import time
from functools import cache
from typing import Any

import redis

from dormant import Agent, ToolContext, tool
from dormant.models import Completion, ModelRequest, SimulatedModel
from dormant.models.base import ChunkSink
from dormant.settings import Settings


@cache
def settings() -> Settings:
    return Settings.from_env()


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings().redis_url, decode_responses=True)


def key(name: str) -> str:
    return f"{settings().key_prefix}:bench:{name}"


class Timed:
    """A SimulatedModel that stamps when each completion starts."""

    name = "simulated"
    context_window = 200_000

    def __init__(self, inner: SimulatedModel) -> None:
        self.inner = inner

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        _redis().hset(key("started"), request.thread_id, repr(time.time()))
        return self.inner.complete(request, on_chunk)


@tool(deferred=True)
def wait_build(target: str, ctx: ToolContext) -> None:
    """Start a CI build; its result is delivered later."""
    call = {"thread_id": ctx.thread_id, "call_id": ctx.call_id, "at": time.time()}
    _redis().rpush(key("calls"), json.dumps(call))


AGENTS = [
    Agent("chat", model=Timed(SimulatedModel())),
    Agent(
        "waiter",
        model=Timed(SimulatedModel(call_every=1, tool="wait_build", tool_args={"target": "x"})),
        tools=[wait_build],
    ),
]


@cache
def _app() -> Any:
    from dormant.worker import create_app

    app = create_app(settings(), AGENTS)

    @app.task(name="bench.noop", shared=False, acks_late=True, ignore_result=True)  # type: ignore[untyped-decorator]
    def noop(sample: str = "") -> None:
        if sample:
            _redis().hset(key("noop_started"), sample, repr(time.time()))
        _redis().incr(key("done"))

    @app.task(name="bench.blocking_agent", shared=False, acks_late=True, ignore_result=True)  # type: ignore[untyped-decorator]
    def blocking_agent(agent: int, wait_s: float) -> None:
        model = SimulatedModel(call_every=1, tool="wait_build", tool_args={"target": "x"})
        from dormant.messages import AssistantTurn, ToolResult, UserText

        items: list[Any] = [UserText(text=f"check build {agent}")]
        first = model.complete(ModelRequest(f"b{agent}", "", tuple(items), ()), lambda _c: None)
        time.sleep(wait_s)  # the tool: this worker slot is held for the whole wait
        items += [
            AssistantTurn(text=first.text, calls=first.calls),
            ToolResult(call_id=first.calls[0].call_id, name="wait_build", content="green"),
        ]
        model.complete(ModelRequest(f"b{agent}", "", tuple(items), ()), lambda _c: None)
        _redis().incr(key("done"))

    return app


def __getattr__(name: str) -> Any:
    if name == "app":
        return _app()
    raise AttributeError(name)
