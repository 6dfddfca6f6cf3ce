"""The example projects' chat page in headless Chromium, served in-process: an answer streams
in token by token, and a reload mid-answer resumes it with nothing missed or repeated.

The page is the examples' own ``chat.html`` (the Django and Flask copies are one file); its
three routes are served here over a ``LocalSystem`` whose ``chat`` agent is a slow simulated
model, the stream by ``tests/sse_route.py`` over the real ``client.astream``. The
examples' own tests (``tests/celery/test_example_*.py``) run the same page in each project,
with its Celery worker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest

from dormant import Agent, LocalSystem
from dormant.messages import AssistantTurn
from dormant.models import SimulatedModel
from dormant.settings import Settings
from tests.browser import chromium, serving
from tests.sse_route import SSERoute

pytestmark = pytest.mark.timeout(180)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PAGE = EXAMPLES / "flask_app" / "shop" / "chat.html"
CHAT = Agent("chat", model=SimulatedModel(completion_chars=360, chunk_chars=6, chunk_delay_s=0.06))
PARTIAL = "#log li.agent.partial"
DONE = "#log li.agent:not(.partial)"


def chat_app(system: LocalSystem) -> Any:
    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/chat/":
            await _reply(send, 200, PAGE.read_bytes(), b"text/html")
            return
        if scope["path"] == "/chat/send":
            form = dict(parse_qsl((await receive())["body"].decode()))
            thread_id = form.get("thread") or ""
            if thread_id:
                system.send(thread_id, form["text"])
            else:
                thread_id = system.launch("chat", form["text"])
            await _reply(
                send, 200, json.dumps({"thread_id": thread_id}).encode(), b"application/json"
            )
            return
        await _reply(send, 404, b"no route", b"text/plain")

    return SSERoute(system, prefix="/chat/").wrap(app)


async def _reply(send: Any, status: int, body: bytes, kind: bytes) -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]}
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def system() -> Iterator[LocalSystem]:
    with LocalSystem([CHAT], "memory://", settings=Settings(chunk_flush_s=0.0)) as system:
        yield system


def partial_length(page: Any) -> int:
    length: int = page.evaluate(
        f"(() => {{ const li = document.querySelector('{PARTIAL}');"
        " return li ? li.textContent.length : 0; })()"
    )
    return length


def wait_longer(page: Any, than: int) -> int:
    page.wait_for_function(
        f"n => {{ const li = document.querySelector('{PARTIAL}');"
        " return li && li.textContent.length > n; }",
        arg=than,
        timeout=30_000,
    )
    return partial_length(page)


def test_the_examples_share_one_chat_page() -> None:
    assert PAGE.read_text() == (EXAMPLES / "django_app" / "shop" / "chat.html").read_text()


def test_the_chat_page_streams_an_answer_and_resumes_it_after_a_reload(
    system: LocalSystem,
) -> None:
    with serving(chat_app(system)) as base, chromium() as browser:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        streams: list[str] = []
        page.on("request", lambda r: streams.append(r.url) if "/events" in r.url else None)
        page.goto(f"{base}/chat/")
        page.fill("input[name=text]", "What teapot should I buy?")
        page.click("button[type=submit]")
        lengths = [wait_longer(page, 0)]
        while len(lengths) < 3:
            lengths.append(wait_longer(page, lengths[-1]))
        page.reload(wait_until="domcontentloaded")
        restored = partial_length(page)
        grown = wait_longer(page, restored)
        page.wait_for_selector(DONE, timeout=30_000)
        answers = page.eval_on_selector_all(DONE, "els => els.map(e => e.textContent)")
        asked = page.eval_on_selector_all("#log li.user", "els => els.map(e => e.textContent)")
        thread_id = page.evaluate("JSON.parse(sessionStorage.getItem('dormant-chat')).thread")
        page.close()
        system.run_until_idle()

    stored = system.history(thread_id)[-1]
    assert isinstance(stored, AssistantTurn)
    assert lengths == sorted(lengths) and len(set(lengths)) == 3
    assert restored >= lengths[-1] and grown > restored  # kept what it showed, then went on
    assert answers == [stored.text]  # whole and once: nothing missed, nothing twice
    assert asked == ["What teapot should I buy?"]
    assert len(streams) == 2 and "after=" not in streams[0] and "after=" in streams[1]
    assert errors == []
