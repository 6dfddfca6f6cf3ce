"""Callback URLs are capabilities; bad input is refused with a reason and changes nothing."""

from __future__ import annotations

import time

import pytest

from dormant.errors import InvalidToken, PayloadTooLarge, ThreadClosed, UnknownThread
from dormant.http.tokens import callback_url, parse_callback_url, sign, verify
from dormant.messages import ToolResult
from dormant.models import call, reply
from dormant.settings import Settings
from dormant.stores.base import InboxState, ThreadStatus
from tests.harness import Harness, results
from tests.test_history_rules import started
from tests.test_waits_and_timers import scripted


def started_build(h: Harness) -> tuple[str, str, str]:
    t = h.launch("a", "build")
    h.step(t)
    h.run_tools()
    call_id = started[-1]
    return t, call_id, h.callback_url(t, call_id)


def harness() -> Harness:
    return Harness(scripted(reply("", call("run_build", target="main")), reply("done")))


def test_a_deferred_tool_result_arrives_through_its_callback_url() -> None:
    h = harness()
    t, call_id, url = started_build(h)
    h.deliver_callback(url, "green", message_id="ci-1")
    h.step(t)
    assert results(h.history(t)) == [ToolResult(call_id=call_id, name="run_build", content="green")]


@pytest.mark.parametrize(
    "tamper",
    [
        lambda url: url.replace("token=", "token=9"),  # altered expiry
        lambda url: url[:-3] + ("AAA" if not url.endswith("AAA") else "BBB"),  # altered MAC
        lambda url: url.replace("/call_", "/call_x"),  # the token names another call
    ],
    ids=["expiry", "mac", "call-id"],
)
def test_an_altered_callback_is_refused_and_nothing_is_stored(tamper: object) -> None:
    h = harness()
    t, _, url = started_build(h)
    before = (h.history(t), h.store.inbox(t))
    with pytest.raises(InvalidToken):
        h.deliver_callback(tamper(url), "green")  # type: ignore[operator]
    assert (h.history(t), h.store.inbox(t)) == before


def test_an_expired_token_is_refused() -> None:
    keys = ("k1",)
    token = sign(keys, "t", "c", int(time.time()) - 1)
    with pytest.raises(InvalidToken, match="expired"):
        verify(keys, token, "t", "c", time.time())


def test_rotated_keys_still_verify_tokens_signed_with_an_older_key() -> None:
    token = sign(("old",), "t", "c", int(time.time()) + 60)
    verify(("new", "old"), token, "t", "c", time.time())
    with pytest.raises(InvalidToken):
        verify(("new",), token, "t", "c", time.time())


def test_a_token_from_another_deployment_is_refused() -> None:
    h = harness()
    t, call_id, _ = started_build(h)
    foreign = callback_url("http://x/cb", ("someone-elses-key",), t, call_id, int(time.time()) + 60)
    with pytest.raises(InvalidToken, match=call_id):
        h.deliver_callback(foreign, "green")


def test_a_url_that_is_not_a_callback_is_refused() -> None:
    with pytest.raises(InvalidToken, match="not a dormant callback URL"):
        parse_callback_url("http://example.test/nothing")


def test_an_oversized_message_is_refused_before_anything_is_stored() -> None:
    h = Harness(scripted(reply("hi")), settings=Settings(max_message_bytes=1024, model_backoff_s=0))
    t = h.launch("a", "hello")
    with pytest.raises(PayloadTooLarge, match=f"thread '{t}' is 2000 bytes; the limit is 1024"):
        h.send(t, "x" * 2000)
    assert len(h.store.inbox(t)) == 1


def test_messages_to_unknown_or_closed_threads_are_refused_naming_the_id() -> None:
    h = harness()
    with pytest.raises(UnknownThread, match="thr_nope"):
        h.send("thr_nope", "hello")
    t = h.launch("a", "hello")
    h.store.set_status(t, ThreadStatus.CLOSED)
    with pytest.raises(ThreadClosed, match=t):
        h.send(t, "anyone there?")
    assert [r.state for r in h.store.inbox(t)] == [InboxState.PENDING]
