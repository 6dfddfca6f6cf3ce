"""The approval queue and a one-click link in a real headless Chromium (``tests/browser.py``):
the queue shows the held call and its arguments, its approve button runs the call once; a
link's page decides nothing until its button is pressed. Screenshots go to
``DORMANT_TEST_SHOTS`` (default /tmp), to be looked at."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dormant import Agent, LocalSystem
from dormant.http.serve import asgi_app
from dormant.http.ui.dashboard import Dashboard
from dormant.http.webhooks import WebhookReceiver
from dormant.settings import Settings
from tests.browser import chromium, serving
from tests.test_approvals import RAN, _refund_and_lookup, _script, lookup, refund

pytestmark = pytest.mark.timeout(180)

UI = "/dormant/ui/"
SHOTS = Path(os.environ.get("DORMANT_TEST_SHOTS", "/tmp"))


@pytest.fixture(autouse=True)
def _clear_runs() -> None:
    RAN.clear()


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as browser:
        yield browser


_CUT_JS = """inputs => inputs.filter(input => {
    const style = getComputedStyle(input);
    const ctx = document.createElement("canvas").getContext("2d");
    ctx.font = style.font;
    const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    return ctx.measureText(input.placeholder).width > room;
}).map(input => input.placeholder)"""
"""The placeholders wider than the room inside their input: a reader sees them cut off."""


def _system(base_url: str | None = None) -> LocalSystem:
    agent = Agent("clerk", model=_script(_refund_and_lookup()), tools=[refund, lookup])
    settings = Settings(callback_base_url=f"{base_url}/dormant/callbacks") if base_url else None
    return LocalSystem([agent], "memory://", settings=settings)


def test_the_queue_approves_a_held_call_from_the_browser(browser: Any) -> None:
    with _system() as system:
        t = system.launch("clerk", "refund o1")
        system.run_until_idle()
        app = asgi_app(system, WebhookReceiver(system, []), Dashboard(system, actions=True))
        with serving(app) as base:
            page = browser.new_page()
            page.goto(base + UI)
            page.click("header a.queue")
            page.wait_for_selector("article.approval[data-call=c_refund]")
            assert "Refund 250.0 to o1?" in page.inner_text("article.approval")
            assert '"amount": 250.0' in page.inner_text("article.approval pre")
            page.screenshot(path=str(SHOTS / "approvals-queue.png"), full_page=True)
            cut = page.eval_on_selector_all("article.approval input[placeholder]", _CUT_JS)
            assert cut == [], f"placeholders cut off at their input's width: {cut}"
            form = "article.approval form:has(button.approve)"
            page.fill(f"{form} input[name=by]", "dana")
            page.click(f"{form} button.approve")
            page.wait_for_selector("p.empty")
            page.screenshot(path=str(SHOTS / "approvals-after.png"), full_page=True)
        system.run_until_idle()
        assert RAN.count(("refund", {"order_id": "o1", "amount": 250.0})) == 1
        assert system.pending_approvals() == []
        assert system.thread(t).status.value == "idle"


def test_a_link_page_decides_only_when_its_button_is_pressed(browser: Any) -> None:
    from tests.browser import free_port

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with _system(base_url) as system:
        t = system.launch("clerk", "refund o1")
        system.run_until_idle()
        links = system.approval_links(t, "c_refund", by="alice@example.com")
        app = asgi_app(system, WebhookReceiver(system, []))
        with serving(app, port=port) as base:
            assert base == base_url
            page = browser.new_page()
            page.goto(links["reject"])
            page.wait_for_selector("form button")
            page.screenshot(path=str(SHOTS / "approval-link.png"), full_page=True)
            assert system.pending_approvals()  # the GET decided nothing
            page.fill("input[name=reason]", "not this month")
            page.click("form button")
            page.wait_for_selector("h1:has-text('Rejected')")
        system.run_until_idle()
        assert not any(name == "refund" for name, _ in RAN)
        assert system.pending_approvals() == []
