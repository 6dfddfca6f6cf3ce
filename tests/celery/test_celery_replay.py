"""A batch of replays on real workers: each is served its source's recorded tool result
in the slice, so the tool runs only for the sources, and each repeats its source."""

from __future__ import annotations

from collections.abc import Callable

from conftest import Deployment, wait_until

from dormant.messages import AssistantTurn, Item, ToolResult
from dormant.stores.base import ThreadStatus


def _tally_runs(d: Deployment) -> int:
    return int(d.redis.get(d.key("runs", "tally")) or 0)


def _shape(items: list[Item]) -> list[object]:
    """Items without their call ids (each run of the model makes fresh ones)."""
    return [
        (i.text, [(c.name, c.args) for c in i.calls])
        if isinstance(i, AssistantTurn)
        else (i.name, i.content)
        if isinstance(i, ToolResult)
        else i
        for i in items
    ]


def test_a_batch_of_replays_on_workers_runs_no_tool_and_repeats_each_source(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy()
    worker = d.start_worker("w1", concurrency=2)
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    sources = [client.launch("tallier", f"count the stock, please ({n})") for n in range(3)]

    def idle(thread_id: str) -> bool:
        return client.thread(thread_id).status is ThreadStatus.IDLE

    wait_until(
        lambda: all(idle(s) for s in sources) and _tally_runs(d) == 3,
        60,
        "the sources to run their tool",
        check=d.check_alive,
    )
    replays = [client.replay(s, tag="celery-batch") for s in sources]
    wait_until(
        lambda: all(idle(r) and len(client.history(r)) == 4 for r in replays),
        60,
        "the replays to finish",
        check=d.check_alive,
    )
    assert _tally_runs(d) == 3  # served from the record: no tool task ran for a replay
    for source, replay in zip(sources, replays, strict=True):
        assert _shape(client.history(replay)) == _shape(client.history(source))
        assert client.thread(replay).metadata["replay"]["tag"] == "celery-batch"
