"""examples/flask_app, run with its README's commands: ``flask --app shop init-db`` makes
both schemas in one database, ``celery -A make_celery worker`` runs the app's task and
dormant's agent, and a real HTTP request launches the agent in the order's transaction."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest
import redis
from conftest import REDIS_URL, wait_until
from example_chat import assert_resumed, chat_and_reload
from example_support import ExampleRun, empty_database, example_run, free_port

pytest.importorskip("flask_sqlalchemy")
pytestmark = pytest.mark.timeout(600)  # three processes start on a busy machine


@pytest.fixture(scope="module")
def flask_app(
    redis_server: redis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ExampleRun, str]]:
    prefix = f"dxf{secrets.token_hex(5)}"
    with empty_database("dormant_flask_example") as (_, url):
        env = {
            "FLASK_SQLALCHEMY_DATABASE_URI": url.replace("postgresql://", "postgresql+psycopg://"),
            "FLASK_CELERY__broker_url": REDIS_URL,
            "FLASK_CELERY__broker_transport_options": f'{{"global_keyprefix": "{prefix}:broker:"}}',
            "FLASK_DORMANT__KEY_PREFIX": prefix,
            "FLASK_DORMANT__SECRET_KEY": secrets.token_hex(16),
        }
        with example_run("flask_app", env, prefix, tmp_path_factory.mktemp(prefix)) as run:
            assert "tables are ready" in run.run("flask", "--app", "shop", "init-db")
            run.start("worker", "celery", "-A", "make_celery", "worker", "-l", "info", "-c", "2")
            port = free_port()
            base = run.serve("web", "flask", "--app", "shop", "run", "--port", str(port), port=port)
            yield run, base


def _last_reply(base: str, thread_id: str) -> str | None:
    answer = httpx.get(f"{base}/threads/{thread_id}/", timeout=30)
    history = answer.json().get("history", []) if answer.status_code == 200 else []
    texts = [i["text"] for i in history if i["kind"] == "assistant" and not i["calls"]]
    return texts[-1] if texts else None


def test_a_committed_order_runs_the_apps_task_and_the_agent_reading_the_order(
    flask_app: tuple[ExampleRun, str],
) -> None:
    run, base = flask_app
    placed = httpx.post(f"{base}/orders/", data={"item": "teapot"}, timeout=30).json()
    order_id, thread_id = placed["order"], placed["thread_id"]

    def order_status() -> str:
        return str(httpx.get(f"{base}/orders/{order_id}/", timeout=30).json()["status"])

    wait_until(lambda: order_status() == "received", 120, "mark_received", check=run.check_alive)
    reply = wait_until(
        lambda: _last_reply(base, thread_id), 120, "the agent's answer", check=run.check_alive
    )
    assert reply.startswith(f"Thanks for waiting: order {order_id} (teapot) is ")


def test_a_rolled_back_order_has_no_thread_and_runs_no_agent(
    flask_app: tuple[ExampleRun, str],
) -> None:
    run, base = flask_app
    answer = httpx.post(f"{base}/orders/", data={"item": "kettle", "reject": "1"}, timeout=30)
    assert answer.status_code == 409
    thread_id = answer.json()["thread_id"]
    placed = httpx.post(f"{base}/orders/", data={"item": "cup"}, timeout=30).json()
    wait_until(
        lambda: _last_reply(base, placed["thread_id"]),
        120,
        "the committed order's agent",
        check=run.check_alive,
    )
    assert httpx.get(f"{base}/threads/{thread_id}/", timeout=30).status_code == 404


def test_the_chat_page_streams_an_answer_and_resumes_it_after_a_reload(
    flask_app: tuple[ExampleRun, str],
) -> None:
    _, base = flask_app

    run = chat_and_reload(base, "What teapot should I buy?")

    assert_resumed(run)
