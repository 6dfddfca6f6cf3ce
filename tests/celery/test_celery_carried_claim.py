"""A wake's claim carried in its publish: one Redis round trip when the wake marks live on
the broker's Redis (``dormant.celery.broker.CarriedClaim``)."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator

import pytest
import redis
from celery.utils.saferepr import saferepr
from conftest import REDIS_URL

from dormant.celery.dispatch import CeleryDispatcher, carries_claims, client_dispatcher
from dormant.settings import Settings
from dormant.stores.base import Priority
from dormant.stores.redis import RedisWakeMarks


@pytest.fixture
def prefix(redis_server: redis.Redis) -> Iterator[str]:
    prefix = f"dcc{secrets.token_hex(5)}"
    yield prefix
    keys = list(redis_server.scan_iter(match=f"{prefix}*"))
    if keys:
        redis_server.delete(*keys)


def _dispatcher(prefix: str) -> tuple[CeleryDispatcher, RedisWakeMarks]:
    settings = Settings(
        broker_url=REDIS_URL,
        redis_url=REDIS_URL,
        key_prefix=prefix,
        broker_key_prefix=f"{prefix}:broker:",
        secret_keys=("k" * 32,),
    )
    marks = RedisWakeMarks(redis.Redis.from_url(REDIS_URL, decode_responses=True), prefix, 30)
    return client_dispatcher(settings, marks), marks


def _queued(redis_server: redis.Redis, prefix: str) -> dict[str, list[str]]:
    """Thread ids by broker list, as a worker would read them."""
    found: dict[str, list[str]] = {}
    for key in redis_server.scan_iter(match=f"{prefix}:broker:dormant.*"):
        if redis_server.type(key) != "list":
            continue
        for raw in redis_server.lrange(key, 0, -1):
            message = json.loads(raw)
            assert message["headers"]["task"] == "dormant.slice"
            body = json.loads(base64.b64decode(message["body"]))
            found.setdefault(key.removeprefix(f"{prefix}:broker:"), []).append(body[1]["thread_id"])
    return found


def test_a_wake_claims_and_publishes_in_one_script_with_the_marks_rules(
    redis_server: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher, marks = _dispatcher(prefix)
    app = dispatcher._app
    assert carries_claims(app, marks)

    def separate_claim(*_: object) -> bool:
        raise AssertionError("the claim is a round trip of its own")

    monkeypatch.setattr(RedisWakeMarks, "claim", separate_claim)
    try:
        assert dispatcher.wake("t1", Priority.BACKGROUND)
        assert not dispatcher.wake("t1", Priority.BACKGROUND)  # one is queued: suppressed
        assert not dispatcher.wake("t1", 0)
        assert dispatcher.wake("t1", Priority.INTERACTIVE)  # user text does not wait
        assert dispatcher.wake("t2", Priority.BACKGROUND)
        marks.clear("t2")  # t2's slice started
        assert dispatcher.wake("t2", Priority.BACKGROUND)
    finally:
        dispatcher.close_broker()

    queued = _queued(redis_server, prefix)
    assert sorted(queued) == ["dormant.background\x06\x163", "dormant.interactive"]
    assert sorted(queued["dormant.background\x06\x163"]) == ["t1", "t2", "t2"]
    assert queued["dormant.interactive"] == ["t1"]
    assert redis_server.pttl(marks.key("t1")) > 0


def test_another_redis_for_the_marks_claims_first_then_sends(prefix: str) -> None:
    settings = Settings(
        broker_url=REDIS_URL,
        redis_url=REDIS_URL,
        key_prefix=prefix,
        secret_keys=("k" * 32,),
    )
    elsewhere = REDIS_URL.rsplit("/", 1)[0] + "/13"
    marks = RedisWakeMarks(redis.Redis.from_url(elsewhere), prefix, 30)
    dispatcher = client_dispatcher(settings, marks)
    try:
        assert not carries_claims(dispatcher._app, marks)
    finally:
        dispatcher.close_broker()


def test_a_sent_task_shows_its_arguments_as_celery_would(
    redis_server: redis.Redis, prefix: str
) -> None:
    """The dispatcher writes the message's argument reprs itself (a send's ``saferepr``
    cost 15 µs); Flower and the worker's log read exactly what Celery would have written,
    and an id past Celery's bound is still shortened by Celery."""
    dispatcher, _ = _dispatcher(prefix)
    long_id = "t" * 2000
    try:
        dispatcher.wake("t1", Priority.BACKGROUND)
        dispatcher.wake(long_id, Priority.BACKGROUND)
    finally:
        dispatcher.close_broker()
    headers = {}
    for key in redis_server.scan_iter(match=f"{prefix}:broker:dormant.*"):
        for raw in redis_server.lrange(key, 0, -1):
            message = json.loads(raw)["headers"]
            body = json.loads(base64.b64decode(json.loads(raw)["body"]))
            headers[body[1]["thread_id"]] = message
    assert headers["t1"]["argsrepr"] == saferepr((), 1024)
    assert headers["t1"]["kwargsrepr"] == saferepr({"thread_id": "t1"}, 1024)
    assert headers[long_id]["kwargsrepr"] == saferepr({"thread_id": long_id}, 1024)
    assert len(headers[long_id]["kwargsrepr"]) < 1100
