"""A thread's stream as Server-Sent Events through a real ``dormant serve`` process.

The agent runs in this process (``LocalSystem`` on an SQLite file) and forwards its live
events to Redis as a worker would (``RedisEvents``); ``dormant serve`` reads the same file
and Redis. A reader that drops the connection and comes back with ``Last-Event-ID`` sees
what an unbroken reader sees; a forged, altered, expired or misplaced token gets 403.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from dormant import Agent, LocalSystem
from dormant.http.tokens import sign, stream_keys
from dormant.settings import Settings
from dormant.stores.redis import RedisEvents, redis_client
from dormant.streams import StreamEvent, StreamEventAdapter, StreamStatus
from tests.stream_support import Streamer, check_rebuilds
from tests.test_serve import free_port, running_serve, serve_env

pytestmark = pytest.mark.timeout(400)  # the server's start is slow when the machine is busy


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalSystem, str]]:
    port = free_port()
    database_url = f"sqlite:///{tmp_path_factory.mktemp('sse') / 'dormant.db'}"
    env = serve_env(port, database_url, f"dsse{secrets.token_hex(5)}")
    settings = Settings.from_env(env).with_(chunk_flush_s=0.0)
    agent = Agent("streamer", model=Streamer(words=60, pause_s=0.003))
    with LocalSystem([agent], database_url, settings=settings) as system:
        events = RedisEvents(redis_client(settings), settings.key_prefix)
        system.on_event(events.publish)  # what a worker's slices publish
        with running_serve(env, port) as base:
            yield system, base


def sse_events(
    url: str,
    last_id: str | None = None,
    stop_after: int | None = None,
    into: list[StreamEvent] | None = None,
) -> list[StreamEvent]:
    """Read SSE messages from ``url`` until the server ends the stream (or ``stop_after``),
    each appended to ``into`` as it arrives."""
    headers = {"Last-Event-ID": last_id} if last_id else {}
    got: list[StreamEvent] = []
    into = got if into is None else into
    with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(60.0)) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["access-control-allow-origin"] == "*"
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if line.startswith(":") or line.startswith("retry:"):
                continue
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if not fields:
                continue
            payload = f'{{"type": "{fields["event"]}", "id": "{fields["id"]}", {fields["data"][1:]}'
            event = StreamEventAdapter.validate_json(payload)
            got.append(event)
            if into is not got:
                into.append(event)
            fields = {}
            if stop_after is not None and len(got) >= stop_after:
                break
    return got


def test_sse_resumes_with_last_event_id_and_ends_when_the_thread_closes(
    served: tuple[LocalSystem, str],
) -> None:
    system, _ = served
    thread_id = system.launch("streamer", "turn 0")
    system.run_until_idle()
    url = system.stream_url(thread_id, ttl_s=120)
    whole: list[StreamEvent] = []
    unbroken = threading.Thread(target=lambda: sse_events(url, into=whole), daemon=True)
    unbroken.start()
    resumed: list[StreamEvent] = []
    reconnects = 0

    def read_in_pieces() -> None:
        nonlocal reconnects
        last: str | None = None
        while not (
            resumed and isinstance(resumed[-1], StreamStatus) and resumed[-1].status == "closed"
        ):
            sse_events(url, last, stop_after=7, into=resumed)
            last = resumed[-1].id if resumed else None
            reconnects += 1

    broken = threading.Thread(target=read_in_pieces, daemon=True)
    broken.start()
    deadline = time.monotonic() + 60
    while len(whole) < 2 or len(resumed) < 2:  # both watch before the next answer starts
        assert time.monotonic() < deadline, "the readers never got the history"
        time.sleep(0.01)
    for turn in range(1, 3):
        system.send(thread_id, f"turn {turn}")
        system.run_until_idle()
    system.close_thread(thread_id)
    unbroken.join(120)
    broken.join(120)
    assert not unbroken.is_alive() and not broken.is_alive()
    assert reconnects > 5
    assert [e.model_dump() for e in resumed] == [e.model_dump() for e in whole]
    check_rebuilds(whole, system.stored_history(thread_id), whole_from=3)
    assert sum(e.type == "chunk" for e in whole) > 60


def test_the_after_parameter_resumes_like_last_event_id(served: tuple[LocalSystem, str]) -> None:
    system, _ = served
    thread_id = system.launch("streamer", "hello")
    system.run_until_idle()
    system.close_thread(thread_id)
    url = system.stream_url(thread_id)
    events = sse_events(url)
    assert [e.type for e in events] == ["item", "item", "status"]
    assert sse_events(f"{url}&after={events[0].id}") == events[1:]


def test_a_forged_altered_expired_or_misplaced_token_gets_403(
    served: tuple[LocalSystem, str],
) -> None:
    system, base = served
    thread_id = system.launch("streamer", "hello")
    other = system.launch("streamer", "hello")
    system.run_until_idle()
    good = system.stream_url(thread_id)
    token = good.split("token=", 1)[1]
    path = urlsplit(good).path
    keys = stream_keys(system.settings.secret_keys)
    expired = sign(keys, thread_id, "", int(time.time()) - 5)
    forged = sign(stream_keys(["not-the-key"]), thread_id, "", int(time.time()) + 600)
    callback = system.callback_url(thread_id, "call_1").split("token=", 1)[1]
    refused = [
        f"{base}{path}",
        f"{base}{path}?token=",
        f"{base}{path}?token={token[:-2]}xx",
        f"{base}{path}?token={expired}",
        f"{base}{path}?token={forged}",
        f"{base}{path}?token={callback}",
        f"{base}{urlsplit(system.stream_url(other)).path}?token={token}",
    ]
    for url in refused:
        response = httpx.get(url, timeout=30)
        assert response.status_code == 403, (url, response.text)
    assert httpx.get(f"{base}/dormant/threads/thr_nobody/events?token={token}").status_code == 403
    nobody = sign(keys, "thr_nobody", "", int(time.time()) + 600)
    missing = httpx.get(f"{base}/dormant/threads/thr_nobody/events?token={nobody}", timeout=30)
    assert missing.status_code == 404
    bad_id = httpx.get(f"{good}&after=nonsense", timeout=30)
    assert bad_id.status_code == 400
    never_given = httpx.get(f"{good}&after=999999.0", timeout=30)
    assert never_given.status_code == 400, never_given.text
    made_up = httpx.get(good, headers={"Last-Event-ID": "57.123"}, timeout=30)
    assert made_up.status_code == 400, made_up.text
