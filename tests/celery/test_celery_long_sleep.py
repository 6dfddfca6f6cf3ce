"""A sleep longer than the broker's visibility timeout wakes its thread exactly once.

With an ETA task the Redis broker would hand the sleeping task to a second worker once the
visibility timeout passed; dormant's sleep is a SQL timer fired by the sweeper instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from conftest import Deployment, wait_until

from dormant.messages import AssistantTurn, ToolResult
from dormant.stores.base import InboxState

VISIBILITY_S = 5
NAP_S = 8


def test_a_sleep_past_the_visibility_timeout_wakes_once(deploy: Callable[..., Deployment]) -> None:
    d = deploy(DORMANT_VISIBILITY_TIMEOUT_S=str(VISIBILITY_S), TEST_NAP_S=str(NAP_S))
    workers = [d.start_worker("w1"), d.start_worker("w2")]
    d.start_beat()
    d.wait_ready(*workers)
    client = d.client()
    started = time.monotonic()
    thread_id = client.launch("napper", "nap")

    wait_until(
        lambda: client.history(thread_id)[-1:] == [AssistantTurn(text="awake")],
        NAP_S + 20,
        "the sleeper to wake up",
        check=d.check_alive,
        poll_s=0.2,
    )
    assert time.monotonic() - started >= NAP_S

    def once() -> None:
        history = client.history(thread_id)
        assert [i.kind for i in history] == ["user", "assistant", "tool_result", "assistant"]
        assert sum(isinstance(i, ToolResult) for i in history) == 1
        rows = client.store.inbox(thread_id)
        assert sum(r.message_id.startswith("timer:") for r in rows) == 1
        assert len(rows) == 2 and all(r.state is InboxState.DONE for r in rows)

    once()
    # Absence can only be observed over time: for one more visibility timeout after the
    # wake-up, nothing else may happen (a redelivered ETA task would have shown by now).
    watch_until = time.monotonic() + VISIBILITY_S
    while time.monotonic() < watch_until:
        d.check_alive()
        once()
        time.sleep(0.5)
