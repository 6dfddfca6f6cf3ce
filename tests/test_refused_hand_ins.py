"""A limit must produce an answer, never a loop: whatever a tool hands in that the thread
refuses, its call still gets exactly one result and the tool runs once.

Found trying dormant as a new user: a ``@tool`` returning 300 KB (over
``max_message_bytes``, 256 KiB) raised ``PayloadTooLarge`` out of the run; its outbox row
stayed unran and the sweeper ran the tool again every claim lifetime, the thread waiting
for ever. Senders outside a tool run (``deliver``, ``send_event``, a callback) are told
instead (``PayloadTooLarge``, 413) and the call still takes a proper result afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.errors import PayloadTooLarge
from dormant.messages import AssistantTurn, EventShown, Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.stores.base import CallState, Store, ThreadStatus
from dormant.tools.runner import execute_outbox
from tests.harness import Harness

LIMIT_BYTES = 256 * 1024
"""``max_message_bytes``' default: the tests hand in more than that."""
TOO_BIG = 300_000

runs: dict[str, int] = {}
told: list[str] = []
later: list[ToolContext] = []


def _ran(name: str) -> None:
    runs[name] = runs.get(name, 0) + 1


@tool
def dump_table(table: str) -> str:
    """Return every row of a table."""
    _ran("dump_table")
    return "r" * TOO_BIG


@tool
def explode(reason: str) -> str:
    """Fail with a very long message."""
    _ran("explode")
    raise ValueError(reason * TOO_BIG)


@tool(deferred=True)
def export(table: str, ctx: ToolContext) -> None:
    """Export a table; the file arrives later."""
    _ran("export")
    later.append(ctx)


@tool(subscription=True)
def watch(repo: str, ctx: ToolContext) -> str:
    """Watch a repository; a huge first event is refused to the tool, which says so."""
    _ran("watch")
    try:
        ctx.send_event("e" * TOO_BIG)
    except PayloadTooLarge as refused:
        told.append(refused.reason)
    return f"watching {repo}"


@tool(subscription=True)
def careless_watch(repo: str, ctx: ToolContext) -> str:
    """Watch a repository, letting the refusal of a huge event escape."""
    _ran("careless_watch")
    ctx.send_event("e" * TOO_BIG)
    return f"watching {repo}"


def script(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText):
        name, args = last.text.split(" ", 1)
        key = {"explode": "reason", "watch": "repo", "careless_watch": "repo"}.get(name, "table")
        return reply("", call(name, **{key: args}))
    return reply("done")


AGENT = Agent(
    "a",
    model=ScriptedModel(script),
    tools=[dump_table, explode, export, watch, careless_watch],
)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    runs.clear()
    told.clear()
    later.clear()


def results(system: LocalSystem, thread_id: str) -> list[ToolResult]:
    return [i for i in system.history(thread_id) if isinstance(i, ToolResult)]


def answered_once(system: LocalSystem, thread_id: str) -> ToolResult:
    """The call's one result; the thread went on past it, and nothing is left to run."""
    [result] = results(system, thread_id)
    assert system.history(thread_id)[-1] == AssistantTurn(text="done")
    assert system.thread(thread_id).status is ThreadStatus.IDLE
    assert system.store.call(thread_id, result.call_id).state is not CallState.PENDING
    assert system.store.undispatched(system.thread(thread_id).updated_at, lost_before=None) == []
    return result


def test_an_oversized_tool_result_becomes_one_error_result(store: Store) -> None:
    with LocalSystem([AGENT], store=store) as system:
        thread_id = system.launch("a", "dump_table orders")
        system.run_until_idle()
        result = answered_once(system, thread_id)
    assert runs == {"dump_table": 1}
    assert result.is_error
    assert result.content == (
        "Error: the tool's result was refused: the result of call "
        f"{result.call_id!r} for thread {thread_id!r} is {TOO_BIG} bytes; "
        f"the limit is {LIMIT_BYTES} (max_message_bytes)"
    )


def test_a_tool_error_too_large_to_store_still_answers_its_call() -> None:
    with LocalSystem([AGENT], "memory://") as system:
        thread_id = system.launch("a", "explode y")
        system.run_until_idle()
        result = answered_once(system, thread_id)
    assert runs == {"explode": 1}
    size = len(f"Error: ValueError: {'y' * TOO_BIG}")  # the error result the tool's failure made
    assert result.is_error and f"is {size} bytes; the limit is {LIMIT_BYTES}" in result.content


def test_an_oversized_send_result_of_a_deferred_tool_becomes_one_error_result() -> None:
    with LocalSystem([AGENT], "memory://") as system:
        thread_id = system.launch("a", "export orders")
        system.run_until_idle()
        [ctx] = later
        ctx.send_result("x" * TOO_BIG)
        system.run_until_idle()
        result = answered_once(system, thread_id)
    assert runs == {"export": 1}
    assert result.is_error and f"is {TOO_BIG} bytes; the limit is {LIMIT_BYTES}" in result.content


def test_an_oversized_event_is_refused_to_the_tool_that_sends_it() -> None:
    with LocalSystem([AGENT], "memory://") as system:
        thread_id = system.launch("a", "watch dormant")
        system.run_until_idle()
        result = answered_once(system, thread_id)
    assert runs == {"watch": 1}
    assert result.content == "watching dormant"
    [reason] = told
    assert f"the event on call {result.call_id!r}" in reason
    assert f"is {TOO_BIG} bytes; the limit is {LIMIT_BYTES}" in reason


def test_an_oversized_event_a_tool_lets_escape_answers_its_call_with_the_refusal() -> None:
    with LocalSystem([AGENT], "memory://") as system:
        thread_id = system.launch("a", "careless_watch dormant")
        system.run_until_idle()
        result = answered_once(system, thread_id)
    assert runs == {"careless_watch": 1}
    assert result.is_error and result.content.startswith("Error: PayloadTooLarge: the event on")


def test_an_oversized_deliver_or_event_from_outside_is_refused_and_the_call_still_answers() -> None:
    with LocalSystem([AGENT], "memory://") as system:
        exporting = system.launch("a", "export orders")
        watching = system.launch("a", "watch dormant")
        system.run_until_idle()
        [ctx] = later
        before = [system.store.inbox(exporting), system.store.inbox(watching)]
        with pytest.raises(PayloadTooLarge, match=f"is {TOO_BIG} bytes; the limit is 262144"):
            system.deliver(exporting, ctx.call_id, "x" * TOO_BIG, message_id="ci-1")
        with pytest.raises(PayloadTooLarge, match=f"the result of call '{ctx.call_id}'"):
            system.deliver_callback(ctx.callback_url, "x" * TOO_BIG)
        [watch_result] = results(system, watching)
        with pytest.raises(PayloadTooLarge, match=f"the event on call '{watch_result.call_id}'"):
            system.send_event(watching, watch_result.call_id, "e" * TOO_BIG)
        assert [system.store.inbox(exporting), system.store.inbox(watching)] == before
        system.deliver(exporting, ctx.call_id, "orders.csv: 3 MB", message_id="ci-1")
        system.run_until_idle()
        assert answered_once(system, exporting).content == "orders.csv: 3 MB"
        assert not [i for i in system.history(watching) if isinstance(i, EventShown)]


class _Unstorable:
    """A sink whose store fails (not unreachable: a bug, a value it rejects) on results
    longer than ``most_chars``, the way a driver raises on a value it cannot write."""

    def __init__(self, inner: Harness, most_chars: int) -> None:
        self.inner = inner
        self.most_chars = most_chars

    def tool_result(self, thread_id: str, call_id: str, content: str, **kw: bool) -> None:
        if len(content) > self.most_chars:
            raise TypeError(f"cannot adapt a value of {len(content)} characters")
        self.inner.tool_result(thread_id, call_id, content, **kw)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@tool
def small_dump(table: str) -> str:
    """Return a few rows."""
    _ran("small_dump")
    return "r" * 500


def test_a_result_the_store_cannot_take_answers_the_call_with_the_error() -> None:
    h = Harness(Agent("a", model=ScriptedModel(script), tools=[small_dump]))
    thread_id = h.launch("a", "small_dump orders")
    h.step(thread_id)
    [row] = h.outbox
    execute_outbox(row, h.store, h.deps.agents, _Unstorable(h, 200), h.callback_url)
    h.step(thread_id)
    [result] = [i for i in h.history(thread_id) if isinstance(i, ToolResult)]
    assert runs == {"small_dump": 1}
    assert result.is_error and result.content == (
        "Error: the tool's result could not be stored: "
        "TypeError: cannot adapt a value of 500 characters"
    )
    assert h.store.undispatched(h.thread(thread_id).updated_at, lost_before=None) == []
