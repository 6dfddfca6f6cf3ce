"""The live log's rules in real Redis (``RedisLive`` and the scripts that write it): nothing
is kept for an unwatched thread, ids stay increasing, a newer attempt or a status change
over pending text writes ``retry``, an older attempt's late text and the text of a
committed turn are dropped, a lost log starts again above every id it gave."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import redis

from dormant.messages import AssistantTurn, Chunk, ItemAdded, StatusChanged, UserText
from dormant.stores.redis import RedisEvents
from dormant.stores.redis_live import RedisLive
from dormant.streams import LiveEntry


@pytest.fixture
def prefix(redis_server: redis.Redis) -> Iterator[str]:
    prefix = f"dlive{secrets.token_hex(5)}"
    yield prefix
    keys = list(redis_server.scan_iter(match=f"{prefix}*"))
    if keys:
        redis_server.delete(*keys)


def _kinds(entries: list[LiveEntry]) -> list[str]:
    return [e.kind for e in entries]


def test_the_live_log_keeps_only_what_is_watched_in_order(
    redis_server: redis.Redis, prefix: str
) -> None:
    events = RedisEvents(redis_server, prefix)
    live = RedisLive(redis_server, prefix)
    events.publish(Chunk(thread_id="t1", text="nobody sees me", attempt="3:1000:a:0"))
    assert not redis_server.exists(*live.keys("t1"))  # an unwatched thread leaves nothing
    live.watch("t1", None)
    events.publish(Chunk(thread_id="t1", text="no boundary yet", attempt="3:2000:b:0"))
    assert live.read("t1", (0, 0), 0.0) == []  # the reader has not read the store yet
    live.watch("t1", 3)
    events.publish(Chunk(thread_id="t1", text="one", attempt="3:2000:b:0"))
    events.publish(Chunk(thread_id="t1", text="two", attempt="3:2000:b:0"))
    events.publish(Chunk(thread_id="t1", text="again", attempt="3:3000:c:0"))  # another attempt
    events.publish(Chunk(thread_id="t1", text="three", attempt="3:2000:b:0"))  # older: dropped
    events.publish_all(
        [
            Chunk(thread_id="t1", text=" tail", attempt="3:3000:c:0"),
            ItemAdded(thread_id="t1", seq=3, item=UserText(text="hi")),
            ItemAdded(thread_id="t1", seq=4, item=AssistantTurn(text="again tail")),
            StatusChanged(thread_id="t1", status="idle"),
        ]
    )
    events.publish(Chunk(thread_id="t1", text="late", attempt="3:3000:c:0"))  # a committed turn's
    entries = live.read("t1", (0, 0), 0.0)
    kinds = ["start", "chunk", "chunk", "retry", "chunk", "chunk", "item", "item", "status"]
    assert _kinds(entries) == kinds  # and not the late chunk: its turn is committed
    ids = [(e.c, e.n) for e in entries]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert ids[6:8] == [(4, 0), (5, 0)]  # the items of seq 3 and 4
    assert all(c == 3 for c, _ in ids[:6]) and ids[8][0] == 5
    assert live.read("t1", ids[4], 0.0) == entries[5:]


def test_a_status_over_pending_text_says_retry_and_a_close_is_remembered(
    redis_server: redis.Redis, prefix: str
) -> None:
    events = RedisEvents(redis_server, prefix)
    live = RedisLive(redis_server, prefix)
    live.watch("t1", 2)
    events.publish(Chunk(thread_id="t1", text="half an answer", attempt="2:1000:a:0"))
    events.publish(StatusChanged(thread_id="t1", status="closed", detail="bye"))
    entries = live.read("t1", (0, 0), 0.0)
    assert _kinds(entries) == ["start", "chunk", "retry", "status"]
    assert entries[2].data == {"reason": "the turn was abandoned: the thread is now closed"}
    assert live.closed_at("t1") == (entries[3].c, entries[3].n)


def test_a_lost_log_starts_again_above_every_id_it_gave(
    redis_server: redis.Redis, prefix: str
) -> None:
    events = RedisEvents(redis_server, prefix)
    live = RedisLive(redis_server, prefix)
    live.watch("t1", 2)
    events.publish(Chunk(thread_id="t1", text="before", attempt="2:1000:a:0"))
    before = live.read("t1", (0, 0), 0.0)
    redis_server.delete(*live.keys("t1"))  # a flush, for this thread
    events.publish(Chunk(thread_id="t1", text="unseen", attempt="2:1000:a:0"))
    live.watch("t1", 2)
    # the same attempt is trusted unwatched for a second (a plain PUBLISH); the next asks
    events.publish(Chunk(thread_id="t1", text="skipped", attempt="2:1000:a:0"))
    events.publish(Chunk(thread_id="t1", text="after", attempt="2:1000:a:1"))
    after = live.read("t1", (before[-1].c, before[-1].n), 0.0)
    assert _kinds(after) == ["start", "chunk"]
    assert after[1].data["text"] == "after"
