"""The agent of the real-worker admission test (``DORMANT_AGENTS=admission_agents``): one
OpenAI-compatible model at the test's local server (``TEST_FAKE_OPENAI_URL``)."""

from __future__ import annotations

import os

from celery.signals import worker_ready
from celery_agents import shared_key, worker_redis

from dormant import Agent
from dormant.models import OpenAIModel

__all__ = ["AGENTS"]

AGENTS = [
    Agent(
        "limited",
        model=OpenAIModel(
            "gpt-test", base_url=os.environ.get("TEST_FAKE_OPENAI_URL"), api_key="test-key"
        ),
        instructions="Answer in one word.",
    )
]


@worker_ready.connect  # type: ignore[untyped-decorator]
def _announce(**_: object) -> None:
    """What ``Deployment.wait_ready`` waits for (``celery_agents`` announces the same way)."""
    key = shared_key(os.environ["DORMANT_KEY_PREFIX"], "ready", os.environ["TEST_WORKER_ID"])
    worker_redis().set(key, os.getpid())
