"""examples/django_app, run with its README's commands: ``manage.py migrate`` makes both
schemas, ``celery -A proj worker`` runs the project's task and dormant's agent, and a real
HTTP request to the view launches the agent only when its transaction commits."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator

import httpx
import pytest
import redis
from conftest import REDIS_URL, wait_until
from example_chat import assert_resumed, chat_and_reload
from example_support import ExampleRun, empty_database, example_run, free_port
from sqlalchemy import create_engine, inspect

pytest.importorskip("django")
pytestmark = pytest.mark.timeout(600)  # three processes start on a busy machine


@pytest.fixture(scope="module")
def django_app(
    redis_server: redis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ExampleRun, str]]:
    prefix = f"dxd{secrets.token_hex(5)}"
    with empty_database("dormant_django_example") as (name, url):
        env = {
            "SHOP_DATABASE": name,
            "SHOP_BROKER_URL": REDIS_URL,
            "SHOP_BROKER_PREFIX": f"{prefix}:broker:",
            "SHOP_DORMANT_PREFIX": prefix,
            "SHOP_DORMANT_SECRET": secrets.token_hex(16),
        }
        with example_run("django_app", env, prefix, tmp_path_factory.mktemp(prefix)) as run:
            output = run.run(sys.executable, "manage.py", "migrate")
            assert "dormant: schema is at its newest migration" in output
            engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
            tables = set(inspect(engine).get_table_names())
            engine.dispose()
            assert {"shop_order", "threads", "inbox", "outbox"} <= tables
            run.start("worker", "celery", "-A", "proj", "worker", "-l", "info", "-c", "2")
            port = free_port()
            base = run.serve(
                "web",
                sys.executable,
                "manage.py",
                "runserver",
                "--noreload",
                f"127.0.0.1:{port}",
                port=port,
            )
            yield run, base


def test_a_committed_order_runs_the_projects_task_and_the_agent_reading_the_order(
    django_app: tuple[ExampleRun, str],
) -> None:
    run, base = django_app
    placed = httpx.post(f"{base}/orders/", data={"item": "teapot"}, timeout=30).json()
    order_id, thread_id = placed["order"], placed["thread_id"]

    def order_status() -> str:
        return str(httpx.get(f"{base}/orders/{order_id}/", timeout=30).json()["status"])

    wait_until(lambda: order_status() == "received", 120, "mark_received", check=run.check_alive)

    def last_reply() -> str | None:
        answer = httpx.get(f"{base}/threads/{thread_id}/", timeout=30)
        history = answer.json().get("history", []) if answer.status_code == 200 else []
        texts = [i["text"] for i in history if i["kind"] == "assistant" and not i["calls"]]
        return texts[-1] if texts else None

    reply = wait_until(last_reply, 120, "the support agent to answer", check=run.check_alive)
    assert reply.startswith(f"Thanks for waiting: order {order_id} (teapot) is ")


def test_a_rolled_back_order_launches_nothing(django_app: tuple[ExampleRun, str]) -> None:
    run, base = django_app
    answer = httpx.post(f"{base}/orders/", data={"item": "kettle", "reject": "1"}, timeout=30)
    assert answer.status_code == 409
    thread_id = answer.json()["thread_id"]
    # A committed order placed after it is answered; by then the rolled-back one would
    # have been too, had anything been sent.
    placed = httpx.post(f"{base}/orders/", data={"item": "cup"}, timeout=30).json()

    def answered(thread: str) -> bool:
        history = httpx.get(f"{base}/threads/{thread}/", timeout=30).json().get("history", [])
        return any(i["kind"] == "assistant" and not i["calls"] for i in history)

    wait_until(
        lambda: answered(placed["thread_id"]),
        120,
        "the committed order's agent",
        check=run.check_alive,
    )
    assert httpx.get(f"{base}/threads/{thread_id}/", timeout=30).status_code == 404
    assert httpx.get(f"{base}/orders/{placed['order'] - 1}/", timeout=30).status_code == 404


def test_the_chat_page_streams_an_answer_and_resumes_it_after_a_reload(
    django_app: tuple[ExampleRun, str],
) -> None:
    _, base = django_app

    run = chat_and_reload(base, "What teapot should I buy?")

    assert_resumed(run)
