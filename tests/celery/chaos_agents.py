"""The agent the chaos test runs while workers are SIGKILLed (``DORMANT_AGENTS=chaos_agents``).

For user text ``u<n>`` the scripted model asks for ``add`` (20-80 ms, so kills land
mid-tool), ``mul`` in parallel when ``n`` is even and the ``sleep(seconds=0)`` built-in
when ``n % 3 == 0``; for anything else (results, late results) it replies with text. The
tools are pure, so running one twice for a call id is harmless. Each completion, tool run
and slice task a worker starts is counted in Redis under the run's prefix, for the report.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence

from celery.signals import task_postrun, task_prerun, worker_ready
from celery_agents import PidRecorded, shared_key, worker_redis

from dormant import Agent, ToolContext, tool
from dormant.messages import Item, UserText
from dormant.models import Completion, ScriptedModel, call, reply

__all__ = ["AGENTS", "busy_key", "completions_key", "plan", "slice_tasks_key", "tool_runs_key"]


def _prefix() -> str:
    return os.environ["DORMANT_KEY_PREFIX"]


_COMPLETIONS = "chaos:completions"


def completions_key(prefix: str) -> str:
    """A Redis list of ``"<thread_id> <pid>"``, one per model completion."""
    return shared_key(prefix, _COMPLETIONS)


def slice_tasks_key(prefix: str) -> str:
    """A Redis counter of ``dormant.slice`` tasks started by any worker."""
    return shared_key(prefix, "chaos", "slice_tasks")


def tool_runs_key(prefix: str) -> str:
    """A Redis hash: call id -> how many times a worker started its tool."""
    return shared_key(prefix, "chaos", "tool_runs")


def _work(ctx: ToolContext) -> None:
    """Count the run (a call run twice means a kill or a redelivery hit it), then take a
    while, so kills land mid-tool."""
    worker_redis().hincrby(tool_runs_key(_prefix()), ctx.call_id, 1)
    time.sleep(random.uniform(0.02, 0.08))


@tool
def add(a: int, b: int, ctx: ToolContext) -> int:
    """Add two numbers (slowly)."""
    _work(ctx)
    return a + b


@tool
def mul(a: int, b: int, ctx: ToolContext) -> int:
    """Multiply two numbers (slowly)."""
    _work(ctx)
    return a * b


def plan(n: int) -> list[tuple[str, dict[str, int | float]]]:
    """The calls the model makes for user text ``u<n>``."""
    calls: list[tuple[str, dict[str, int | float]]] = [("add", {"a": n, "b": 1})]
    if n % 2 == 0:
        calls.append(("mul", {"a": n, "b": 2}))
    if n % 3 == 0:
        calls.append(("sleep", {"seconds": 0}))
    return calls


def _script(history: Sequence[Item]) -> Completion:
    last = history[-1]
    if isinstance(last, UserText):
        n = int(last.text.removeprefix("u"))
        return reply(f"on {last.text}", *(call(name, **args) for name, args in plan(n)))
    return reply(f"after {last.kind}")


chaos = Agent("chaos", model=PidRecorded(ScriptedModel(_script), _COMPLETIONS), tools=[add, mul])

AGENTS = [chaos]


def busy_key(prefix: str, worker: str) -> str:
    """A Redis counter: slice and tool tasks the worker is running now (the chaos test
    prefers to kill a worker in the middle of one)."""
    return shared_key(prefix, "chaos", "busy", worker)


_WORK_TASKS = frozenset({"dormant.slice", "dormant.tool"})


@task_prerun.connect  # type: ignore[untyped-decorator]
def _started(sender: object = None, **_: object) -> None:
    name = getattr(sender, "name", None)
    if name in _WORK_TASKS:
        with worker_redis().pipeline(transaction=False) as pipe:
            pipe.incr(busy_key(_prefix(), os.environ["TEST_WORKER_ID"]))
            if name == "dormant.slice":
                pipe.incr(slice_tasks_key(_prefix()))
            pipe.execute()


@task_postrun.connect  # type: ignore[untyped-decorator]
def _ended(sender: object = None, **_: object) -> None:
    if getattr(sender, "name", None) in _WORK_TASKS:
        worker_redis().decr(busy_key(_prefix(), os.environ["TEST_WORKER_ID"]))


@worker_ready.connect  # type: ignore[untyped-decorator]
def _announce(**_: object) -> None:
    """What ``Deployment.wait_ready`` waits for (``celery_agents`` announces the same way)."""
    key = shared_key(_prefix(), "ready", os.environ["TEST_WORKER_ID"])
    worker_redis().set(key, os.getpid())
