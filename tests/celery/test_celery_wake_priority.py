"""User text reaches the interactive queue even while a background slice of its thread is
queued (issue 11): the wake mark remembers the priority queued, not just "queued".

No worker runs here: the test reads kombu's Redis lists under the deployment's broker key
prefix to see which queue holds which slice message.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence

from conftest import Deployment

from dormant import Agent, ToolContext, tool
from dormant.messages import Item, ToolResult
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.runtime.slice import Waiting
from dormant.worker import QUEUE_BACKGROUND, QUEUE_INTERACTIVE
from tests.harness import Harness


@tool(deferred=True)
def start_job(name: str, ctx: ToolContext) -> None:
    """Start a job whose result arrives later."""


def _script(items: Sequence[Item]) -> Completion:
    if isinstance(items[-1], ToolResult):
        return reply("job done")
    return reply("starting", call("start_job", name="build"))


def _slices_in(d: Deployment, queue: str) -> list[str]:
    """Thread ids of the ``dormant.slice`` messages in ``queue`` (every priority list)."""
    found = []
    broker_prefix = d.env["DORMANT_BROKER_KEY_PREFIX"]
    for key in d.redis.scan_iter(match=f"{broker_prefix}{queue}*", count=1000):
        if d.redis.type(key) != "list":
            continue
        for raw in d.redis.lrange(key, 0, -1):
            message = json.loads(raw)
            if message["headers"]["task"] != "dormant.slice":
                continue
            _args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            found.append(kwargs["thread_id"])
    return found


def test_user_text_behind_a_queued_tool_result_reaches_the_interactive_queue(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy()
    client = d.client()
    agent = Agent("jobs", model=ScriptedModel(_script), tools=[start_job])
    # One slice, in this process, against the deployment's database: the thread now waits
    # on a deferred call, with no slice message queued anywhere.
    driver = Harness(agent, settings=d.settings.with_(model_backoff_s=0.0), store=client.store)
    t = driver.launch("jobs", "build it")
    outcome = driver.step(t)
    assert isinstance(outcome, Waiting)
    (call_id,) = outcome.call_ids
    assert _slices_in(d, QUEUE_BACKGROUND) == _slices_in(d, QUEUE_INTERACTIVE) == []

    client.deliver(t, call_id, "build 42: green")  # a background wake: queued
    client.send(t, "urgent: stop the deploy")  # user text: must not wait behind it

    assert _slices_in(d, QUEUE_BACKGROUND) == [t]
    assert _slices_in(d, QUEUE_INTERACTIVE) == [t]
    client.send(t, "and tell me when done")  # an interactive slice is already queued
    assert _slices_in(d, QUEUE_INTERACTIVE) == [t]
