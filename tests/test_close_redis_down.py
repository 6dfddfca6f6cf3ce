"""A close is stored first: Redis being down afterwards (no lease to revoke, no events to
publish) must not make a close that happened look failed, to the CLI or to a caller.

Redis is "down" as an unused port on 127.0.0.1; the store is a real SQLite database.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from dormant.client import Client
from dormant.stores.base import ThreadStatus
from dormant.stores.sql.store import SQLStore, upgrade
from tests.test_cli_errors import DOWN, run
from tests.test_store_contract import enqueue, new_thread


@pytest.fixture
def database(tmp_path: Path) -> Iterator[tuple[str, SQLStore]]:
    url = f"sqlite:///{tmp_path}/dormant.db"
    upgrade(url)
    store = SQLStore(url)
    yield url, store
    store.close()


def test_dormant_close_with_redis_down_says_the_thread_is_closed_and_warns(
    tmp_path: Path, database: tuple[str, SQLStore]
) -> None:
    url, store = database
    thread_id = new_thread(store).id
    enqueue(store, thread_id, "still queued")
    cwd = tmp_path / "cwd"
    cwd.mkdir()

    ran = run(cwd, "close", thread_id, "--reason", "the customer left", DORMANT_DATABASE_URL=url)

    assert ran.code == 0, ran.err
    assert ran.out == f"thread {thread_id} is closed: the customer left\n"
    assert "Traceback" not in ran.err
    warnings = ran.err.strip().splitlines()
    assert warnings, "the skipped Redis part is reported"
    assert all(w.startswith(f"warning: thread {thread_id} is closed, but ") for w in warnings)
    assert any("lease was not revoked" in w and "Redis" in w for w in warnings), warnings
    assert store.thread(thread_id).status is ThreadStatus.CLOSED
    again = run(cwd, "close", thread_id, DORMANT_DATABASE_URL=url)
    assert again.code == 0 and "the customer left" in again.out


def test_client_close_thread_with_redis_down_returns_the_closed_thread(
    database: tuple[str, SQLStore], caplog: pytest.LogCaptureFixture
) -> None:
    url, store = database
    thread_id = new_thread(store).id
    down = f"redis://{DOWN}/0"
    env = {"DORMANT_DATABASE_URL": url, "DORMANT_REDIS_URL": down, "DORMANT_BROKER_URL": down}
    client = Client.from_env(env)
    try:
        with caplog.at_level(logging.WARNING, logger="dormant.client"):
            closed = client.close_thread(thread_id, reason="done")
    finally:
        client.close()
    assert closed.status is ThreadStatus.CLOSED and closed.closed_reason == "done"
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"thread {thread_id} is closed, but") for m in said), said
