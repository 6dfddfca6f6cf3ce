"""The demo's triage agent for Celery workers: ``DORMANT_AGENTS=examples.distributed.agents``.

Its model is ``dormant demo``'s scripted one, so no API key is needed. The fake CI service
is a Redis list: ``run_build`` queues the job with its callback URL and returns at once (a
deferred tool); ``client.py`` plays CI, picks the job up and calls back.
"""

from __future__ import annotations

import json
import os

import redis

from dormant import Agent, ToolContext, tool
from dormant.demo import triage_script
from dormant.models import ScriptedModel

CI_QUEUE = "dormant-example:ci-jobs"


@tool(deferred=True)
def run_build(target: str, ctx: ToolContext) -> None:
    """Start a CI build of ``target``; the result arrives when the build finishes."""
    ci = redis.Redis.from_url(os.environ["DORMANT_REDIS_URL"])
    ci.rpush(CI_QUEUE, json.dumps({"target": target, "callback_url": ctx.callback_url}))
    ci.close()


@tool(subscription=True)
def watch_pull_requests(repo: str) -> str:
    """Subscribe to pull requests opened on ``repo``."""
    return f"Watching {repo} for new pull requests."


triage = Agent(
    "triage",
    model=ScriptedModel(triage_script, name="scripted-triage"),
    instructions="You watch CI builds and pull requests for the acme/api team.",
    tools=[run_build, watch_pull_requests],
)
