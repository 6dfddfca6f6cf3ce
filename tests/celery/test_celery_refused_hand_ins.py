"""On a real worker, a tool result over ``max_message_bytes`` answers its call once with
an error result, and the tool runs once.

Found trying dormant as a new user: the tool task raised ``PayloadTooLarge``, its outbox
row stayed unran, and the sweeper ran the tool again every claim lifetime (5 runs in
2.5 minutes) while the thread stayed ``waiting``.
"""

from __future__ import annotations

from collections.abc import Callable

from conftest import Deployment, wait_until

from dormant.messages import AssistantTurn, ToolResult
from dormant.stores.base import ThreadStatus


def test_an_oversized_tool_result_on_a_worker_becomes_one_error_result_and_runs_once(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_TOOL_CLAIM_TTL_S="2")  # a re-run, if any, would come within seconds
    worker = d.start_worker("w1", concurrency=2)
    d.start_beat()
    d.wait_ready(worker)
    client = d.client()
    thread_id = client.launch("dumper", "dump the orders table")

    wait_until(
        lambda: client.history(thread_id)[-1:] == [AssistantTurn(text="done")],
        30,
        "the thread to go on past the oversized result",
        check=d.check_alive,
        poll_s=0.1,
    )
    [result] = [i for i in client.history(thread_id) if isinstance(i, ToolResult)]
    assert result.is_error
    assert "is 300000 bytes; the limit is 262144 (max_message_bytes)" in result.content
    assert client.thread(thread_id).status is ThreadStatus.IDLE
    assert d.unran(client, thread_id) == []  # the row ran: no re-run
    assert int(d.redis.get(d.key("runs", "dump_table")) or 0) == 1
