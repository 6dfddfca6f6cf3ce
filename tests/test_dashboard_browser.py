"""The dashboard in headless Chromium: pages load, filters work, actions run, a live answer
appears token by token.

The app is ``dormant serve``'s (``asgi_app`` with the dashboard) under uvicorn on a loopback
port, over a ``LocalSystem`` whose agents run in this process; the thread stream's SSE route
is ``dormant serve``'s own, opened with the page's signed ``client.stream_url``. A slow
simulated model streams the answer the live test watches.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from dormant import Agent, LocalSystem
from dormant.demo import run_build, watch_pull_requests
from dormant.errors import ModelFatal, ModelRetryable
from dormant.http.serve import asgi_app
from dormant.http.ui.dashboard import Dashboard
from dormant.http.ui.guard import TokenGate
from dormant.http.ui.setup import client_stream_url
from dormant.http.webhooks import WebhookReceiver
from dormant.messages import AssistantTurn, Item, UserText
from dormant.models import ScriptedModel, SimulatedModel, call, reply
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.models.registry import register_provider
from dormant.settings import Settings
from dormant.stores.base import ThreadStatus
from tests.browser import chromium, growing_lengths, serving

pytestmark = pytest.mark.timeout(180)

UI = "/dormant/ui/"
SHOTS = Path(os.environ.get("DORMANT_TEST_SHOTS", "/tmp"))
"""Where the live view's screenshots go, to be looked at."""


PROVIDER = {"down": True}
"""Whether the echo model refuses text that starts with "fail" (a retry after a fix)."""


def answer(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText) and last.text.startswith("fail") and PROVIDER["down"]:
        raise ModelFatal("provider answered 401: invalid key")
    return reply("echo: " + (last.text if isinstance(last, UserText) else "?"))


SLOW = SimulatedModel(completion_chars=240, chunk_chars=6, chunk_delay_s=0.08)


class DropsItsFirstStream:
    """Streams "LOST " words, then fails (a dropped stream); the retry streams the answer."""

    name = "drops-first"
    context_window = 100_000

    def __init__(self) -> None:
        self.attempts = 0

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        self.attempts += 1
        if self.attempts == 1:
            for _ in range(12):
                on_chunk("LOST ")
                time.sleep(0.08)  # a slow provider, not a wait for work
            raise ModelRetryable("stream dropped")
        for word in ["kept ", "answer ", "only"]:
            on_chunk(word)
            time.sleep(0.08)
        return reply("kept answer only")


AGENTS = [
    Agent("echo", model=ScriptedModel(answer)),
    Agent("writer", model=SLOW),
    Agent("flaky", model=DropsItsFirstStream()),
]


@pytest.fixture
def system() -> Iterator[LocalSystem]:
    settings = Settings(chunk_flush_s=0.0)
    with LocalSystem(AGENTS, "memory://", settings=settings) as system:
        yield system


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as browser:
        yield browser


def app_of(system: LocalSystem, **dashboard: Any) -> Any:
    """``dormant serve``'s app: the dashboard, and the thread stream's SSE route it reads
    with the signed URLs of ``client.stream_url``."""
    dashboard.setdefault("stream_url", client_stream_url(system))
    board = Dashboard(system, **dashboard)
    return asgi_app(system, WebhookReceiver(system, []), board)


def rows(page: Any) -> list[str]:
    return page.eval_on_selector_all("tr[data-thread]", "rs => rs.map(r => r.dataset.thread)")


def watch_errors(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors


def test_the_list_loads_and_its_filters_work(system: LocalSystem, browser: Any) -> None:
    PROVIDER["down"] = True
    ok = system.launch("echo", "hello", thread_id="thr_ok")
    bad = system.launch("echo", "fail now", thread_id="thr_bad")
    other = system.launch("writer", "a short note", thread_id="thr_writer")
    system.run_until_idle(raise_on_failure=False)

    with serving(app_of(system)) as base:
        page = browser.new_page()
        errors = watch_errors(page)
        page.goto(base + UI)
        everything = rows(page)
        page.click("a.chip.c-stalled")
        page.wait_for_url("**status=stalled**")
        stalled = rows(page)
        page.click("a.chip.c-all")
        page.fill("input[name=agent]", "writer")
        page.click(".agent-filter button")
        page.wait_for_url("**agent=writer**")
        writers = rows(page)
        page.click(f"a[href$='thread?id={other}']")
        page.wait_for_selector("ol.items li.bubble.assistant")
        title = page.inner_text("h1")

        page.close()  # ends its event stream before the server stops
    assert sorted(everything) == sorted([ok, bad, other])
    assert stalled == [bad]
    assert writers == [other]
    assert title == other
    assert errors == []


def test_retry_and_close_from_the_thread_page(system: LocalSystem, browser: Any) -> None:
    PROVIDER["down"] = True
    bad = system.launch("echo", "fail now", thread_id="thr_bad")
    system.run_until_idle(raise_on_failure=False)
    PROVIDER["down"] = False  # the operator fixed the key: a retry now succeeds

    with serving(app_of(system, actions=True)) as base:
        page = browser.new_page()
        errors = watch_errors(page)
        page.goto(f"{base}{UI}thread?id={bad}")
        before = page.get_attribute(".head .badge", "data-status")
        page.click("button.retry")
        page.wait_for_selector(".head .badge:not([data-status=stalled])")
        system.run_until_idle(raise_on_failure=False)
        page.on("dialog", lambda dialog: dialog.accept())
        page.fill("form[action$='thread/close'] input[name=reason]", "checked by hand")
        page.click("button.close")
        page.wait_for_selector(".head .badge[data-status=closed]")

        page.close()  # ends its event stream before the server stops
    assert before == "stalled"
    assert (system.thread(bad).status, system.thread(bad).closed_reason) == (
        ThreadStatus.CLOSED,
        "checked by hand",
    )
    assert errors == []


def test_a_live_answer_appears_token_by_token(system: LocalSystem, browser: Any) -> None:
    thread_id = system.launch("echo", "hello", thread_id="thr_live")
    system.run_until_idle()
    with serving(app_of(system)) as base:
        page = browser.new_page()
        errors = watch_errors(page)
        page.goto(f"{base}{UI}thread?id={thread_id}")
        page.wait_for_function("document.querySelector('.stream-state').textContent === 'live'")

        writer = system.launch("writer", "draft the notes", thread_id="thr_live_writer")
        page.goto(f"{base}{UI}thread?id={writer}")
        lengths = growing_lengths(page, wanted=4)
        page.wait_for_selector("ol.items li.bubble.assistant[data-seq='2']", timeout=30_000)
        streaming_hidden = page.is_hidden(".bubble.streaming")
        final = page.inner_text("ol.items li.bubble.assistant[data-seq='2'] .text")
        system.run_until_idle()

        page.close()  # ends its event stream before the server stops
    stored = system.history(writer)[-1]
    assert lengths == sorted(lengths) and len(set(lengths)) == 4
    assert lengths[-1] < len(final)
    assert streaming_hidden
    assert final == stored.text  # type: ignore[union-attr]
    assert errors == []


def test_a_token_guards_the_dashboard_and_a_login_opens_it(
    system: LocalSystem, browser: Any
) -> None:
    thread_id = system.launch("echo", "hello", thread_id="thr_ok")
    system.run_until_idle()

    with serving(app_of(system, gate=TokenGate("s3cret"))) as base:
        page = browser.new_page()
        page.goto(base + UI)
        at_login = page.url
        page.fill("input[name=token]", "wrong")
        page.click("button[type=submit]")
        refused = page.inner_text(".alert")
        page.fill("input[name=token]", "s3cret")
        page.click("button[type=submit]")
        page.wait_for_selector("tr[data-thread]")
        listed = rows(page)

        page.close()  # ends its event stream before the server stops
    assert at_login == f"{base}{UI}login"
    assert "not the dashboard token" in refused
    assert listed == [thread_id]


def test_a_thread_page_reloaded_mid_answer_picks_the_answer_up_again(
    system: LocalSystem, browser: Any
) -> None:
    with serving(app_of(system)) as base:
        page = browser.new_page()
        errors = watch_errors(page)
        writer = system.launch("writer", "draft the notes", thread_id="thr_reload")
        page.goto(f"{base}{UI}thread?id={writer}")
        before = growing_lengths(page, wanted=3)[-1]
        page.reload(wait_until="domcontentloaded")
        after = growing_lengths(page, wanted=1, start=before - 1)[-1]
        page.wait_for_selector("ol.items li.bubble.assistant[data-seq='2']", timeout=30_000)
        answers = page.eval_on_selector_all(
            "ol.items li.bubble.assistant .text", "els => els.map(e => e.textContent)"
        )
        page.close()
        system.run_until_idle()

    assert after >= before  # the stream gave the partial answer back, then went on
    assert answers == [system.history(writer)[-1].text]  # type: ignore[union-attr]
    assert errors == []


def test_a_retried_turn_drops_its_partial_text_from_the_page(
    system: LocalSystem, browser: Any
) -> None:
    with serving(app_of(system)) as base:
        page = browser.new_page()
        errors = watch_errors(page)
        thread_id = system.launch("flaky", "say something", thread_id="thr_flaky")
        page.goto(f"{base}{UI}thread?id={thread_id}")
        page.wait_for_function(
            "(document.querySelector('.bubble.streaming .text') || {}).textContent"
            "?.includes('LOST')"
        )
        page.wait_for_selector("ol.items li.bubble.assistant[data-seq='2']", timeout=30_000)
        shown = page.inner_text("ol.items")
        streaming_hidden = page.is_hidden(".bubble.streaming")
        page.close()
        system.run_until_idle()

    assert "turn retried" in shown
    assert "LOST" not in shown
    assert "kept answer only" in shown
    assert streaming_hidden
    assert errors == []


class Operator:
    """Starts a build (deferred) and watches pull requests (a subscription); told "stop", it
    streams a word, holds until ``release`` is set, then cancels the subscription."""

    name = "operator"
    context_window = 100_000

    def __init__(self) -> None:
        self.release = threading.Event()

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        last = request.items[-1]
        if isinstance(last, UserText) and last.text == "start":
            return reply(
                "starting",
                call("run_build", target="main"),
                call("watch_pull_requests", repo="acme/api"),
            )
        if isinstance(last, UserText) and last.text == "stop":
            on_chunk("stopping ")
            assert self.release.wait(60), "the test never released the model"
            watch = next(
                c.call_id
                for item in request.items
                if isinstance(item, AssistantTurn)
                for c in item.calls
                if c.name == "watch_pull_requests"
            )
            return reply("stopping", call("cancel_subscription", call_id=watch))
        return reply("done")


def call_state(page: Any, name: str) -> str:
    return str(page.text_content(f"li.call:has(.fn:text-is('{name}')) .state"))


def test_the_live_view_shows_what_the_store_made_of_each_event(browser: Any) -> None:
    """An interrupted call reads "interrupted", a cancelled subscription "cancelled", the
    head's badge follows the thread, and a message sent after the page opened shows at once,
    queued, before the slice that answers it commits."""
    operator = Operator()
    agent = Agent(
        "operator",
        model=operator,
        tools=[run_build, watch_pull_requests],
        steering="interrupt",
    )
    settings = Settings(chunk_flush_s=0.0, secret_keys=("k",))
    with LocalSystem([agent], "memory://", settings=settings) as system:
        thread_id = system.launch("operator", "start", thread_id="thr_operator")
        system.run_until_idle()
        with serving(app_of(system)) as base:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = watch_errors(page)
            page.goto(f"{base}{UI}thread?id={thread_id}")
            page.wait_for_function("document.querySelector('.stream-state').textContent === 'live'")
            loaded = (
                call_state(page, "run_build"),
                call_state(page, "watch_pull_requests"),
                page.text_content(".head .badge"),
            )

            system.send(thread_id, "stop")  # the model holds: nothing is committed yet
            try:
                page.wait_for_selector("li.bubble.user.queued:has-text('stop')", timeout=15_000)
                page.wait_for_selector(".bubble.streaming:not([hidden])", timeout=15_000)
                page.screenshot(path=str(SHOTS / "live-queued.png"))
            finally:
                operator.release.set()
            system.run_until_idle()
            page.wait_for_function(
                "document.querySelector('li.call .state') !== null &&"
                " [...document.querySelectorAll('li.call .state')].map(s => s.textContent)"
                ".join(',') === 'interrupted,cancelled,answered'",
                timeout=15_000,
            )
            page.wait_for_function(
                "document.querySelector('.head .badge').textContent === 'idle'", timeout=15_000
            )
            page.screenshot(path=str(SHOTS / "live-after.png"), full_page=True)
            after = (
                call_state(page, "run_build"),
                call_state(page, "watch_pull_requests"),
                page.text_content(".head .badge"),
            )
            queued_left = page.locator("li.queued").count()
            page.close()

    assert loaded == ("pending", "subscribed", "waiting")
    assert after == ("interrupted", "cancelled", "idle")
    assert queued_left == 0
    assert errors == []


class Held:
    """``model``, holding every completion until ``go`` is set."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.name = model.name
        self.context_window = model.context_window
        self.go = threading.Event()

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        assert self.go.wait(60), "the test never let the model go"
        completion: Completion = self.model.complete(request, on_chunk)
        return completion


def test_the_family_tree_follows_children_spawned_after_the_page_opened(browser: Any) -> None:
    from examples.family import AGENT as RELEASE

    held = Held(RELEASE.model)
    agent = Agent("release", model=held, tools=RELEASE.tools, threads=True)
    with LocalSystem([agent], "memory://", settings=Settings(chunk_flush_s=0.0)) as system:
        parent = system.launch("release", "Is release 1.4 ready to ship?", thread_id="thr_rel")
        with serving(app_of(system)) as base:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = watch_errors(page)
            page.goto(f"{base}{UI}thread?id={parent}")
            page.wait_for_function("document.querySelector('.stream-state').textContent === 'live'")
            tree_at_load = page.locator("#side ul.tree").count()
            held.go.set()
            system.run_until_idle()
            children = {c.id: c.status.value for c in system.store.children(parent)}
            page.wait_for_function(
                "[...document.querySelectorAll('#side ul.tree ul .badge')]"
                f".filter(b => b.textContent === 'closed').length === {len(children)}",
                timeout=15_000,
            )
            page.screenshot(path=str(SHOTS / "live-tree.png"), full_page=True)
            shown = page.eval_on_selector_all(
                "#side ul.tree ul > li",
                "lis => lis.map(li => [li.querySelector('a').textContent,"
                " li.querySelector('.badge').textContent])",
            )
            head = page.text_content(".head .badge")
            clipped = page.eval_on_selector_all(
                "#side ul.tree li",
                "lis => lis.filter(li => li.scrollWidth > li.clientWidth).length",
            )
            stray = page.locator("#items li.line").all_text_contents()
            page.close()
        status = system.thread(parent).status.value

    assert tree_at_load == 0
    assert len(children) == 2 and dict(shown) == children
    assert head == status
    assert clipped == 0, "every thread's id, status and agent are readable in the tree"
    assert stray == [], "dispatches show on their calls, not as lines after the last item"
    assert errors == []


def test_the_replays_page_fits_a_laptop_screen(browser: Any) -> None:
    """Seven columns of long answers and divergences wrap inside the page at 1,280 px: the
    table and its header bar are no wider than the window (the table was 1,711 px)."""
    long_answer = " ".join(["a long answer that goes on"] * 12)
    register_provider("wide", lambda name: ScriptedModel(lambda items: reply(name + long_answer)))
    agent = Agent("echo", model=ScriptedModel(lambda items: reply("said " + long_answer)))
    with LocalSystem([agent], "memory://") as system:
        source = system.launch("echo", "hello", thread_id="thr_a_rather_long_source_id")
        system.run_until_idle()
        for _ in range(3):
            system.replay(source, model="wide:differently", tag="wide")
        system.run_until_idle()
        with serving(app_of(system)) as base:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{base}{UI}replays?tag=wide")
            widths = page.evaluate(
                "[document.documentElement.scrollWidth,"
                " document.querySelector('table').scrollWidth,"
                " document.querySelector('header.top').offsetWidth]"
            )
            page.screenshot(path=str(SHOTS / "replays.png"), full_page=True)
            page.close()
    page_width, table_width, header_width = widths
    assert page_width <= 1280, f"the page scrolls sideways: {widths}"
    assert table_width <= 1280 and header_width == page_width, widths
