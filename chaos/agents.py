"""The agent ``make chaos`` runs (``DORMANT_AGENTS=chaos.agents``): every kind of work.

For each user text ``u<n>`` the scripted model asks, by ``n % 4``, for a deferred job and a plain
tool; a subscription; a timer (``sleep``) and a child thread; or a plain tool alone. Anything
else (results, events, a child's first turn) gets a text reply, so every thread comes to
rest. The tools note what the driver must answer (callback URLs, subscriptions) in the
stats Redis (``CHAOS_STATS_URL``), which no fault touches, and each worker counts the slices
it starts there.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cache

import redis
from celery.signals import task_prerun, worker_ready

from dormant import Agent, ToolContext, tool
from dormant.messages import AssistantTurn, Item, ToolCall, UserText
from dormant.models import Completion, ScriptedModel, call, reply

__all__ = ["AGENTS", "CALLBACKS", "READY", "SLICES", "SUBSCRIPTIONS", "TOOL_RUNS"]

CALLBACKS = "chaos:callbacks"
"""A list of callback URLs of deferred jobs, for the driver to deliver."""
SUBSCRIPTIONS = "chaos:subscriptions"
"""A list of ``"<thread_id> <call_id>"`` of started subscriptions, for the driver's events."""
SLICES = "chaos:slices"
TOOL_RUNS = "chaos:tool_runs"
READY = "chaos:ready:"


@cache
def stats() -> redis.Redis:
    return redis.Redis.from_url(os.environ["CHAOS_STATS_URL"], decode_responses=True)


@tool(deferred=True)
def start_job(name: str, ctx: ToolContext) -> None:
    """Start a job; its result comes back through the callback URL."""
    stats().rpush(CALLBACKS, ctx.callback_url)
    stats().incr(TOOL_RUNS)


@tool(subscription=True)
def watch(topic: str, ctx: ToolContext) -> str:
    """Subscribe to a topic: its events come later."""
    stats().rpush(SUBSCRIPTIONS, f"{ctx.thread_id} {ctx.call_id}")
    stats().incr(TOOL_RUNS)
    return f"watching {topic}"


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    stats().incr(TOOL_RUNS)
    return a + b


def _plan(n: int) -> tuple[ToolCall, ...]:
    plans = [
        (call("start_job", name=f"job{n}"), call("add", a=n, b=1)),
        (call("watch", topic=f"topic{n}"),),
        (call("sleep", seconds=1), call("spawn_thread", instructions=f"child of {n}")),
        (call("add", a=n, b=2),),
    ]
    return plans[n % 4]


def _script(history: Sequence[Item]) -> Completion:
    """Every user text ``u<n>`` applied since the model last spoke gets its plan: a slice
    that applied several at once (its workers were slow or down) still starts all their
    work, so the run exercises every kind whatever the timing."""
    since = len(history)
    while since > 0 and not isinstance(history[since - 1], AssistantTurn):
        since -= 1
    texts = [
        item.text
        for item in history[since:]
        if isinstance(item, UserText) and item.text[:1] == "u" and item.text[1:].isdigit()
    ]
    if texts:
        calls = [c for text in texts for c in _plan(int(text[1:]))]
        return reply(f"on {', '.join(texts)}", *calls)
    return reply(f"seen {history[-1].kind}")


chaos = Agent("chaos", model=ScriptedModel(_script), tools=[start_job, watch, add], threads=True)

AGENTS = [chaos]


@task_prerun.connect  # type: ignore[untyped-decorator]
def _count_slices(sender: object = None, **_: object) -> None:
    if getattr(sender, "name", None) == "dormant.slice":
        stats().incr(SLICES)


@worker_ready.connect  # type: ignore[untyped-decorator]
def _announce(**_: object) -> None:
    stats().set(READY + os.environ["CHAOS_WORKER"], os.getpid())
