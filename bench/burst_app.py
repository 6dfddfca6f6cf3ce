"""The worker side of ``bench/burst.py``: its one agent.

``dormant worker --agents burst_app`` imports this module (``bench/`` on ``PYTHONPATH``);
``BURST_PROVIDER_URL`` is the driver's rate-limited server. The agent ``burst`` answers
every message with one streamed completion from that server, through ``OpenAIModel``
exactly as a deployment would call a provider. Slot time asleep in backoff is the
workers' own admission counter (``<prefix>:admission``, ``asleep_s``), kept with and
without limits.
"""

from __future__ import annotations

import os

from dormant import Agent
from dormant.models import OpenAIModel

MODEL = "bench-burst"

AGENTS = [
    Agent(
        "burst",
        model=OpenAIModel(
            MODEL, base_url=os.environ.get("BURST_PROVIDER_URL", "http://127.0.0.1:9/v1")
        ),
        instructions="Summarise the event in one line.",
    )
]
