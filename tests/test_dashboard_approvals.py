"""The dashboard's approval queue through ``Dashboard.handle``: it lists every held call
with its arguments, decides only with actions on and the page's CSRF token, and shows a
refusal (a page left open while another channel decided) instead of applying it."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import pytest

from dormant import Agent, LocalSystem
from dormant.http.ui.dashboard import Dashboard, UIRequest, UIResponse
from dormant.http.ui.guard import CSRF_COOKIE
from dormant.messages import ApprovalDecision
from tests.harness import results
from tests.test_approvals import RAN, _refund_and_lookup, _script, lookup, refund

ROOT = "/dormant/ui/"


@pytest.fixture(autouse=True)
def _clear_runs() -> None:
    RAN.clear()


@pytest.fixture
def system() -> Iterator[LocalSystem]:
    agent = Agent("clerk", model=_script(_refund_and_lookup()), tools=[refund, lookup])
    with LocalSystem([agent], "memory://") as system:
        yield system


def _held(system: LocalSystem) -> str:
    t = system.launch("clerk", "refund o1")
    system.run_until_idle()
    return t


def get(dashboard: Dashboard, path: str = "approvals", **query: str) -> UIResponse:
    return dashboard.handle(UIRequest("GET", path, ROOT, query=query))


def post(dashboard: Dashboard, form: dict[str, str], cookies: dict[str, str]) -> UIResponse:
    return dashboard.handle(UIRequest("POST", "approvals/decide", ROOT, form=form, cookies=cookies))


def page_form(dashboard: Dashboard, decision: str) -> tuple[dict[str, str], dict[str, str]]:
    """The queue page's form for ``decision`` and the CSRF cookie, as a browser holds them."""
    page = get(dashboard)
    cookie = dict(page.headers)["set-cookie"].split(";")[0].split("=", 1)[1]
    text = page.body.decode()
    start = text.index(f'name="decision" value="{decision}"')
    form_start = text.rindex("<form", 0, start)
    fields = re.findall(
        r'<input type="hidden" name="(\w+)" value="([^"]*)"', text[form_start : start + 60]
    )
    form = {k: html.unescape(v) for k, v in fields}
    return form, {CSRF_COOKIE: cookie}


def test_the_queue_lists_held_calls_with_their_arguments(system: LocalSystem) -> None:
    t = _held(system)
    page = get(Dashboard(system))
    text = page.body.decode()
    assert page.status == 200
    assert 'data-call="c_refund"' in text and "Refund 250.0 to o1?" in text
    assert "&quot;amount&quot;: 250.0" in text
    assert t in text and "read-only" not in text
    assert "<form" not in text  # read-only: no forms
    assert 'data-call="c_refund"' not in get(Dashboard(system), root="thr_other").body.decode()
    assert 'data-call="c_refund"' in get(Dashboard(system), root=t).body.decode()


def test_approve_needs_actions_and_the_pages_csrf_token(system: LocalSystem) -> None:
    t = _held(system)
    board = Dashboard(system, actions=True)
    form, cookies = page_form(board, "approve")
    assert (
        Dashboard(system)
        .handle(UIRequest("POST", "approvals/decide", ROOT, form=form, cookies=cookies))
        .status
        == 403
    )
    assert post(board, {**form, "csrf": "0" * 64}, cookies).status == 403
    assert system.pending_approvals()  # nothing decided yet
    done = post(board, {**form, "by": "dana"}, cookies)
    assert done.status == 303
    system.run_until_idle()
    assert RAN.count(("refund", {"order_id": "o1", "amount": 250.0})) == 1
    [made] = [i for i in system.history(t) if isinstance(i, ApprovalDecision)]
    assert (made.by, made.channel) == ("dana", "dashboard")


def test_an_edit_from_the_queue_is_checked_and_a_stale_page_is_refused(
    system: LocalSystem,
) -> None:
    t = _held(system)
    board = Dashboard(system, actions=True)
    form, cookies = page_form(board, "edit")
    bad = post(board, {**form, "by": "dana", "args": '{"order_id": "o1", "amount": "x"}'}, cookies)
    assert bad.status == 409 and "amount" in bad.body.decode()
    not_json = post(board, {**form, "by": "dana", "args": "{"}, cookies)
    assert not_json.status == 400
    system.reject(t, "c_refund", by="erin", reason="changed my mind")
    stale = post(board, {**form, "by": "dana", "args": '{"order_id": "o1", "amount": 1}'}, cookies)
    assert stale.status == 409 and "already decided" in stale.body.decode()
    system.run_until_idle()
    assert not any(name == "refund" for name, _ in RAN)
    assert len([r for r in results(system.history(t)) if r.call_id == "c_refund"]) == 1


def test_flask_serves_the_queue_behind_the_host_apps_auth(system: LocalSystem) -> None:
    from flask import Flask, request

    from dormant.contrib.dashboard import flask_blueprint

    t = _held(system)
    app = Flask(__name__)
    allow = lambda: request.headers.get("X-Operator") == "yes"  # noqa: E731
    app.register_blueprint(
        flask_blueprint(lambda: system, allow=allow, actions=True), url_prefix="/ops/dormant"
    )
    web = app.test_client()
    operator = {"X-Operator": "yes"}
    assert web.get("/ops/dormant/approvals").status_code == 403
    page = web.get("/ops/dormant/approvals", headers=operator).get_data(as_text=True)
    assert 'data-call="c_refund"' in page
    start = page.index('name="decision" value="approve"')
    fields = dict(
        re.findall(r'name="(\w+)" value="([^"]*)"', page[page.rindex("<form", 0, start) : start])
    )
    form = {k: html.unescape(v) for k, v in fields.items()}
    form |= {"decision": "approve", "by": "flask-op"}
    assert web.post("/ops/dormant/approvals/decide", data=form).status_code == 403
    done = web.post("/ops/dormant/approvals/decide", data=form, headers=operator)
    assert done.status_code == 303
    assert done.headers["Location"] == "/ops/dormant/approvals"
    system.run_until_idle()
    [made] = [i for i in system.history(t) if isinstance(i, ApprovalDecision)]
    assert (made.by, made.channel) == ("flask-op", "dashboard")


def test_a_thread_page_says_which_call_awaits_approval(system: LocalSystem) -> None:
    t = _held(system)
    page = get(Dashboard(system), "thread", id=t).body.decode()
    assert "awaiting approval</a>" in page and f"approvals?root={t}" in page
