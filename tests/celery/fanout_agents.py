"""The fan-out agent the distributed fan-out test runs (``DORMANT_AGENTS=fanout_agents``).

One scripted agent plays both roles: the parent spawns ``FANOUT`` children in one turn; each
child reports ``result of task N`` to its parent, then closes; the parent answers every
batch of reports. Each completion is recorded in Redis with the worker's pid, so the test
can tell which worker processes ran slices.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence

from celery.signals import worker_ready
from celery_agents import PidRecorded, shared_key, worker_redis

from dormant import Agent
from dormant.messages import EventShown, Item, ToolResult, UserText
from dormant.models import Completion, ScriptedModel, call, reply

__all__ = ["AGENTS", "CHILD_DELAY_S", "FANOUT", "completions_key"]

FANOUT = 20
CHILD_DELAY_S = 0.05
"""Each child completion takes this long, so one worker cannot take every child slice."""
_SEED = re.compile(r"^You are now inside child thread \S+, spawned by thread \S+\. Your task: (.+)")


_COMPLETIONS = "fanout:completions"


def completions_key(prefix: str) -> str:
    """A Redis list of ``"<thread_id> <pid>"``, one per completion."""
    return shared_key(prefix, _COMPLETIONS)


def _fanout(history: Sequence[Item]) -> Completion:
    last = history[-1]
    if isinstance(last, UserText):
        spawns = [call("spawn_thread", instructions=f"task {n}") for n in range(FANOUT)]
        return reply(f"fanning out to {FANOUT} children", *spawns)
    if isinstance(last, EventShown):  # a batch of reports (the parent)
        events = sum(isinstance(i, EventShown) for i in history)
        return reply(f"noted {events} events")
    if isinstance(last, ToolResult):
        seed = _SEED.match(last.content)
        if last.name == "spawn_thread" and seed:  # a child's first input
            task = seed.group(1).strip()
            time.sleep(CHILD_DELAY_S)
            return reply("reporting", call("report_to_parent", report=f"result of {task}"))
        if last.name == "report_to_parent":
            time.sleep(CHILD_DELAY_S)
            return reply("closing", call("close_thread"))
        if last.name == "spawn_thread":  # the parent, after its spawn calls were answered
            return reply("waiting for reports")
    raise AssertionError(f"the fan-out script has no answer to {last!r}")


fanout = Agent("fanout", model=PidRecorded(ScriptedModel(_fanout), _COMPLETIONS), threads=True)

AGENTS = [fanout]


@worker_ready.connect  # type: ignore[untyped-decorator]
def _announce(**_: object) -> None:
    """What ``Deployment.wait_ready`` waits for (``celery_agents`` announces the same way)."""
    key = shared_key(os.environ["DORMANT_KEY_PREFIX"], "ready", os.environ["TEST_WORKER_ID"])
    worker_redis().set(key, os.getpid())
