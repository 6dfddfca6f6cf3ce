"""Ordering under concurrency: two workers, 50 threads, 20 messages each from 4 processes,
with Redis as broker; the same with RabbitMQ, on 20 threads to keep the suite short (the
order comes from the inbox in SQL, never from the broker)."""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Callable

import pytest
from celery_senders import send_messages
from conftest import BROKERS, Deployment, scaled, wait_until

from dormant.client import Client
from dormant.messages import AssistantTurn, UserText
from dormant.stores.base import InboxState

THREADS = {"redis": 50, "amqp": 20}
SENDERS = 4
PER_SENDER = 5
EXPECTED_USER_TEXTS = 1 + SENDERS * PER_SENDER


def _settled(client: Client, thread_id: str) -> bool:
    if client.store.inbox(thread_id, InboxState.PENDING):
        return False
    history = client.history(thread_id)
    users = sum(isinstance(item, UserText) for item in history)
    return users == EXPECTED_USER_TEXTS and isinstance(history[-1], AssistantTurn)


def _intervals(d: Deployment, thread_id: str) -> list[tuple[float, float]]:
    raw = d.redis.lrange(d.key("intervals", thread_id), 0, -1)
    return sorted((float(s), float(e)) for s, e, _pid in (r.split() for r in raw))


@pytest.mark.parametrize("broker", BROKERS)
def test_concurrent_senders_keep_order_and_no_slices_overlap(
    deploy: Callable[..., Deployment], broker: str
) -> None:
    d = deploy(broker)
    threads = THREADS[broker]
    workers = [d.start_worker("w1"), d.start_worker("w2")]
    d.start_beat()
    client = d.client()
    thread_ids = [client.launch("echo", "start", message_id="start") for _ in range(threads)]
    d.wait_ready(*workers)

    with multiprocessing.get_context("spawn").Pool(SENDERS) as pool:
        sends = [
            pool.apply_async(send_messages, (d.env, sender, thread_ids, PER_SENDER))
            for sender in range(SENDERS)
        ]
        assert sum(s.get(timeout=scaled(90)) for s in sends) == threads * SENDERS * PER_SENDER

    remaining = set(thread_ids)

    def all_settled() -> bool:
        remaining.difference_update([t for t in list(remaining) if _settled(client, t)])
        return not remaining

    wait_until(
        all_settled, 90, "every thread to apply its messages", check=d.check_alive, poll_s=0.2
    )

    slices = 0
    for thread_id in thread_ids:
        stored = client.stored_history(thread_id)
        assert [s.seq for s in stored] == list(range(1, len(stored) + 1))
        assert len({s.message_id for s in stored}) == len(stored), "an item was stored twice"
        users = [s.item.text for s in stored if isinstance(s.item, UserText)]
        assert sorted(users) == sorted(
            ["start", *(f"s{k}-{i}" for k in range(SENDERS) for i in range(PER_SENDER))]
        )
        assert users[0] == "start"
        for sender in range(SENDERS):
            mine = [u for u in users if u.startswith(f"s{sender}-")]
            assert mine == [f"s{sender}-{i}" for i in range(PER_SENDER)], f"{thread_id}: {users}"
        assert stored[-1].item == AssistantTurn(text=f"seen {EXPECTED_USER_TEXTS}")
        rows = client.store.inbox(thread_id)
        assert len(rows) == EXPECTED_USER_TEXTS
        assert all(r.state is InboxState.DONE for r in rows)
        intervals = _intervals(d, thread_id)
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end, f"two slices of {thread_id} overlapped"
        slices += len(intervals)
    # Batching: fewer completions than messages (each completion applies all queued text).
    assert slices < threads * EXPECTED_USER_TEXTS
