"""The dashboard in a real ``dormant serve`` process, in headless Chromium.

``dormant serve`` runs as a subprocess with ``DORMANT_UI_TOKEN`` on an SQLite file and
Redis; the agent runs in this process and forwards its live events to Redis as a worker
would. The browser logs in with the token, opens a thread and watches the answer arrive
through ``dormant serve``'s own stream, opened with the page's signed stream URL.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest

from dormant import Agent, LocalSystem
from dormant.models import SimulatedModel
from dormant.settings import Settings
from dormant.stores.redis import RedisEvents, redis_client
from tests.browser import chromium, growing_lengths
from tests.test_serve import free_port, running_serve, serve_env

pytestmark = pytest.mark.timeout(400)  # the server's start is slow when the machine is busy

TOKEN = "ui-" + secrets.token_hex(8)
SLOW = SimulatedModel(completion_chars=240, chunk_chars=5, chunk_delay_s=0.08)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalSystem, str]]:
    port = free_port()
    database_url = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'dormant.db'}"
    env = serve_env(port, database_url, f"dui{secrets.token_hex(5)}")
    env["DORMANT_UI_TOKEN"] = TOKEN
    settings = Settings.from_env(env).with_(chunk_flush_s=0.0)
    with LocalSystem([Agent("writer", model=SLOW)], database_url, settings=settings) as system:
        events = RedisEvents(redis_client(settings), settings.key_prefix)
        system.on_event(events.publish)  # what a worker's slices publish
        with running_serve(env, port) as base:
            yield system, base


def test_dormant_serve_guards_the_dashboard_with_its_token(
    served: tuple[LocalSystem, str],
) -> None:
    _, base = served

    anonymous = httpx.get(f"{base}/dormant/ui/", timeout=30)
    bearer = httpx.get(f"{base}/dormant/ui/", headers={"Authorization": f"Bearer {TOKEN}"})
    wrong = httpx.get(f"{base}/dormant/ui/", headers={"Authorization": "Bearer nope"})

    assert (anonymous.status_code, anonymous.headers["location"]) == (303, "/dormant/ui/login")
    assert bearer.status_code == 200 and "text/html" in bearer.headers["content-type"]
    assert wrong.status_code == 303


def test_a_live_answer_reaches_the_page_through_dormant_serve(
    served: tuple[LocalSystem, str],
) -> None:
    system, base = served
    with chromium() as browser:
        page = browser.new_page()
        page.goto(f"{base}/dormant/ui/login")
        page.fill("input[name=token]", TOKEN)
        page.click("button[type=submit]")
        page.wait_for_selector("table.threads")
        thread_id = system.launch("writer", "draft the notes")
        page.goto(f"{base}/dormant/ui/thread?id={thread_id}")
        stream_url = page.get_attribute("#live", "data-stream")
        lengths = growing_lengths(page, wanted=3)
        page.wait_for_selector("ol.items li.bubble.assistant[data-seq='2']", timeout=30_000)
        final = page.inner_text("ol.items li.bubble.assistant[data-seq='2'] .text")
        page.close()
    system.run_until_idle()

    assert stream_url is not None
    assert stream_url.startswith(f"/dormant/threads/{thread_id}/events?token=")
    assert lengths == sorted(lengths) and len(set(lengths)) == 3
    assert final == system.history(thread_id)[-1].text  # type: ignore[union-attr]


def test_without_a_token_a_public_bind_refuses_even_requests_relayed_to_loopback(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``ssh -L``, ``kubectl port-forward`` or a sidecar make a request from anywhere arrive
    on 127.0.0.1: on ``--host 0.0.0.0`` the bind decides, so only the token opens it."""
    database_url = f"sqlite:///{tmp_path_factory.mktemp('bind') / 'dormant.db'}"
    with LocalSystem([], database_url):
        pass  # the schema
    answers: dict[tuple[str, bool], tuple[int, int, int]] = {}
    for host, token in (("0.0.0.0", False), ("127.0.0.1", False), ("0.0.0.0", True)):
        port = free_port()
        env = serve_env(port, database_url, f"dbind{secrets.token_hex(5)}")
        env["DORMANT_UI_ACTIONS"] = "1"
        env.pop("DORMANT_UI_TOKEN", None)
        if token:
            env["DORMANT_UI_TOKEN"] = TOKEN
        auth = {"Authorization": f"Bearer {TOKEN}"} if token else {}
        with running_serve(env, port, host=host) as base:  # base is http://127.0.0.1:<port>
            page = httpx.get(f"{base}/dormant/ui/", headers=auth, timeout=30)
            close = httpx.post(f"{base}/dormant/ui/thread/close", data={"id": "thr_x"})
            anonymous = httpx.get(f"{base}/dormant/ui/", timeout=30)
        answers[(host, token)] = (page.status_code, close.status_code, anonymous.status_code)

    assert answers[("0.0.0.0", False)] == (403, 403, 403)
    assert answers[("127.0.0.1", False)][0] == 200
    assert answers[("0.0.0.0", True)] == (200, 303, 303)  # the anonymous go to the login
