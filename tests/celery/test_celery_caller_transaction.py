"""``Client.launch(..., connection=...)``: dormant's rows in the caller's own transaction.

A real worker runs the agent only when the caller's transaction commits; after a rollback
there is no thread, no inbox row and no wake.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from conftest import Deployment, wait_until
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from dormant.client import Client
from dormant.errors import UnknownThread
from dormant.messages import AssistantTurn
from dormant.stores.sql.store import make_engine


@pytest.fixture
def running(deploy: Callable[..., Deployment]) -> Iterator[tuple[Deployment, Client, Engine]]:
    deployment = deploy()
    deployment.wait_ready(deployment.start_worker("w1", concurrency=2), timeout_s=90)
    # As in production: a wake sent on a bare Connection goes out as COMMIT is issued, and a
    # slice that starts before the rows are visible leaves them to the sweeper.
    deployment.start_beat()
    engine = make_engine(deployment.env["DORMANT_DATABASE_URL"])
    yield deployment, deployment.client(), engine
    engine.dispose()


def _woken(client: Client) -> list[str]:
    """Record the wakes ``client`` sends (and still send them)."""
    sent: list[str] = []
    waker = client._waker

    def recording(thread_id: str, priority: int) -> None:
        sent.append(thread_id)
        waker(thread_id, priority)

    client._waker = recording
    return sent


def _replied(client: Client, thread_id: str) -> bool:
    return any(isinstance(i, AssistantTurn) for i in client.history(thread_id))


def test_a_launch_in_a_committed_session_runs_after_the_commit(
    running: tuple[Deployment, Client, Engine],
) -> None:
    deployment, client, engine = running
    woken = _woken(client)
    with Session(engine) as session:
        session.execute(text("SELECT 1"))
        thread_id = client.launch("echo", "hello", connection=session)
        assert woken == []  # nothing is sent while the transaction is open
        assert (
            session.execute(
                text("SELECT count(*) FROM threads WHERE id = :id"), {"id": thread_id}
            ).scalar_one()
            == 1
        )
        session.commit()
    assert woken == [thread_id]
    wait_until(
        lambda: _replied(client, thread_id), 90, "echo to reply", check=deployment.check_alive
    )


def test_a_launch_in_a_rolled_back_session_leaves_no_thread_and_sends_no_wake(
    running: tuple[Deployment, Client, Engine],
) -> None:
    _, client, engine = running
    woken = _woken(client)
    with Session(engine) as session:
        thread_id = client.launch("echo", "hello", connection=session)
        session.rollback()
    assert woken == []
    with pytest.raises(UnknownThread):
        client.thread(thread_id)


def test_a_send_on_a_committed_connection_reaches_the_running_thread(
    running: tuple[Deployment, Client, Engine],
) -> None:
    deployment, client, engine = running
    thread_id = client.launch("echo", "one")
    wait_until(
        lambda: _replied(client, thread_id), 90, "the first reply", check=deployment.check_alive
    )
    with engine.connect() as conn:
        client.send(thread_id, "two", connection=conn)
        conn.commit()

    def second_reply() -> bool:
        return any(
            isinstance(i, AssistantTurn) and i.text == "seen 2" for i in client.history(thread_id)
        )

    wait_until(second_reply, 90, "the reply to the second message", check=deployment.check_alive)
