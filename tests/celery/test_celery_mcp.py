"""An MCP tool on a real Celery worker: the call runs in a ``dormant.tool`` task (off the
slice) and its result, or its error, comes back through the inbox."""

from __future__ import annotations

from collections.abc import Callable

from conftest import Deployment, wait_until

from dormant.messages import AssistantTurn, ToolResult
from dormant.stores.base import ThreadStatus


def test_an_mcp_tool_runs_in_a_tool_task_and_its_result_resumes_the_thread(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy(DORMANT_AGENTS="mcp_agents")
    worker = d.start_worker("w1", concurrency=2)
    d.wait_ready(worker, timeout_s=240)  # importing the agents lists the server's tools
    client = d.client()

    ok = client.launch("mcp_caller", 'add {"a": 20, "b": 22}')
    bad = client.launch("mcp_caller", 'fail {"reason": "no such disk"}')

    def replied(thread_id: str) -> bool:
        history = client.history(thread_id)
        last = history[-1] if history else None
        return isinstance(last, AssistantTurn) and last.text.startswith("got: ")

    for thread_id in (ok, bad):
        wait_until(
            lambda t=thread_id: replied(t), 300, "the MCP call's result", check=d.check_alive
        )
        assert client.thread(thread_id).status is ThreadStatus.IDLE

    [good] = [i for i in client.history(ok) if isinstance(i, ToolResult)]
    assert (good.name, good.content, good.is_error) == ("add", "42", False)
    [failed] = [i for i in client.history(bad) if isinstance(i, ToolResult)]
    assert failed.is_error
    assert failed.content == (
        "Error: McpToolError: tool 'fail' reported an error: "
        "Error executing tool fail: no such disk"
    )
