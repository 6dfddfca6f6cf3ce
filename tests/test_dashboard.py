"""The dashboard's pages and guards, through ``Dashboard.handle`` (no server, no browser)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from dormant import Agent, Budget, LocalSystem
from dormant.errors import ModelFatal
from dormant.http.ui.dashboard import Dashboard, UIRequest, UIResponse
from dormant.http.ui.guard import CSRF_COOKIE, SESSION_COOKIE, TokenGate
from dormant.http.ui.listing import PAGE_SIZE
from dormant.messages import Item, UserText
from dormant.models import ScriptedModel, reply
from dormant.models.base import Completion
from dormant.stores.base import ThreadStatus

ROOT = "/dormant/ui/"


def answer(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText) and last.text.startswith("fail"):
        raise ModelFatal("provider answered 401")
    return reply(f"echo: {last.text if isinstance(last, UserText) else '?'}")


@pytest.fixture
def system() -> Iterator[LocalSystem]:
    agents = [
        Agent("echo", model=ScriptedModel(answer)),
        Agent("other", model=ScriptedModel(answer)),
    ]
    with LocalSystem(agents, "memory://") as system:
        yield system


def get(dashboard: Dashboard, path: str = "", **query: str) -> UIResponse:
    return dashboard.handle(UIRequest("GET", path, ROOT, query=query))


def post(
    dashboard: Dashboard, path: str, form: dict[str, str], cookies: dict[str, str]
) -> UIResponse:
    return dashboard.handle(UIRequest("POST", path, ROOT, form=form, cookies=cookies))


def listed(response: UIResponse) -> list[str]:
    return re.findall(r'<tr data-thread="([^"]+)"', response.body.decode())


def csrf_of(dashboard: Dashboard, thread_id: str) -> tuple[dict[str, str], str]:
    """A page's CSRF cookie and the token in its forms, as a browser would hold them."""
    page = get(dashboard, "thread", id=thread_id)
    cookie = dict(page.headers)["set-cookie"].split(";")[0].split("=", 1)[1]
    token = re.findall(r'name="csrf" value="([0-9a-f]+)"', page.body.decode())[0]
    return {CSRF_COOKIE: cookie}, token


def test_the_list_filters_by_status_and_agent(system: LocalSystem) -> None:
    ok = system.launch("echo", "hello", thread_id="thr_ok")
    other = system.launch("other", "hi", thread_id="thr_other")
    stalled = system.launch("echo", "fail now", thread_id="thr_bad")
    system.run_until_idle(raise_on_failure=False)
    dashboard = Dashboard(system)

    assert sorted(listed(get(dashboard))) == sorted([ok, other, stalled])
    assert listed(get(dashboard, status="stalled")) == [stalled]
    assert sorted(listed(get(dashboard, agent="echo"))) == sorted([ok, stalled])
    assert listed(get(dashboard, status="idle", agent="other")) == [other]
    assert get(dashboard, status="sleepy").status == 400


def test_the_list_pages_by_keyset_without_gaps_or_repeats(system: LocalSystem) -> None:
    made = {system.launch("other", f"n{n}") for n in range(PAGE_SIZE + 7)}
    dashboard = Dashboard(system)

    first = get(dashboard)
    older = re.findall(r'class="older" href="([^"]+)"', first.body.decode())[0]
    query = parse_qs(urlsplit(html.unescape(older)).query)
    second = get(dashboard, before=query["before"][0])

    assert len(listed(first)) == PAGE_SIZE and len(listed(second)) == 7
    assert set(listed(first)) | set(listed(second)) == made
    assert 'class="older"' not in second.body.decode()


def test_a_thread_page_shows_its_timeline_escaped_and_its_wait(system: LocalSystem) -> None:
    thread_id = system.launch("echo", "<script>alert(1)</script>")
    system.run_until_idle()
    body = get(Dashboard(system), "thread", id=thread_id).body.decode()

    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "<script>alert" not in body
    assert "echo: &lt;script&gt;" in body
    assert 'data-seq="2"' in body
    assert get(Dashboard(system), "thread", id="thr_nope").status == 404


def test_actions_are_refused_while_the_dashboard_is_read_only(system: LocalSystem) -> None:
    thread_id = system.launch("echo", "fail please")
    system.run_until_idle(raise_on_failure=False)
    dashboard = Dashboard(system)

    page = get(dashboard, "thread", id=thread_id).body.decode()
    refused = post(dashboard, "thread/close", {"id": thread_id}, {})

    assert "read-only" in page and "thread/close" not in page
    assert refused.status == 403
    assert system.thread(thread_id).status is ThreadStatus.STALLED


def test_retry_and_close_need_the_pages_csrf_token(system: LocalSystem) -> None:
    thread_id = system.launch("echo", "fail please")
    system.run_until_idle(raise_on_failure=False)
    dashboard = Dashboard(system, actions=True)
    cookies, token = csrf_of(dashboard, thread_id)

    forged = post(dashboard, "thread/close", {"id": thread_id, "csrf": "0" * 64}, cookies)
    no_cookie = post(dashboard, "thread/close", {"id": thread_id, "csrf": token}, {})
    assert (forged.status, no_cookie.status) == (403, 403)
    assert system.thread(thread_id).status is ThreadStatus.STALLED

    retried = post(dashboard, "thread/retry", {"id": thread_id, "csrf": token}, cookies)
    assert retried.status == 303
    assert system.thread(thread_id).status is not ThreadStatus.STALLED
    system.run_until_idle(raise_on_failure=False)

    closed = post(
        dashboard, "thread/close", {"id": thread_id, "csrf": token, "reason": "done"}, cookies
    )
    assert closed.status == 303
    assert dict(closed.headers)["location"] == f"{ROOT}thread?id={thread_id}"
    assert (system.thread(thread_id).status, system.thread(thread_id).closed_reason) == (
        ThreadStatus.CLOSED,
        "done",
    )


def test_a_post_from_another_origin_is_refused_even_with_the_token(system: LocalSystem) -> None:
    thread_id = system.launch("echo", "hello")
    system.run_until_idle()
    dashboard = Dashboard(system, actions=True)
    cookies, token = csrf_of(dashboard, thread_id)
    request = UIRequest(
        "POST",
        "thread/close",
        ROOT,
        form={"id": thread_id, "csrf": token},
        cookies=cookies,
        headers={"origin": "https://evil.example", "host": "127.0.0.1:8000"},
    )

    assert dashboard.handle(request).status == 403
    assert system.thread(thread_id).status is ThreadStatus.IDLE


@pytest.mark.parametrize(
    ("server", "client", "headers", "allowed"),
    [
        ("127.0.0.1", "127.0.0.1", {}, True),
        ("::1", "::1", {}, True),
        ("0.0.0.0", "127.0.0.1", {}, False),
        ("10.0.0.5", "10.0.0.9", {}, False),
        ("127.0.0.1", "127.0.0.1", {"x-forwarded-for": "203.0.113.7"}, False),
        ("127.0.0.1", "127.0.0.1", {"forwarded": "for=203.0.113.7"}, False),
    ],
)
def test_without_a_token_only_a_local_bind_and_peer_get_in(
    system: LocalSystem, server: str, client: str, headers: dict[str, str], allowed: bool
) -> None:
    dashboard = Dashboard(system, gate=TokenGate("", bind_host=server))
    request = UIRequest("GET", "", ROOT, headers=headers, client_host=client)

    assert (dashboard.handle(request).status == 200) is allowed


def test_with_a_token_a_browser_logs_in_and_a_script_sends_it(system: LocalSystem) -> None:
    dashboard = Dashboard(system, gate=TokenGate("s3cret", bind_host="0.0.0.0"))
    public = {"client_host": "203.0.113.7"}

    anonymous = dashboard.handle(UIRequest("GET", "", ROOT, **public))
    login_page = dashboard.handle(UIRequest("GET", "login", ROOT, **public))
    cookie = dict(login_page.headers)["set-cookie"].split(";")[0].split("=", 1)[1]
    token = re.findall(r'name="csrf" value="([0-9a-f]+)"', login_page.body.decode())[0]
    jar = {CSRF_COOKIE: cookie}
    wrong = dashboard.handle(
        UIRequest(
            "POST", "login", ROOT, form={"token": "guess", "csrf": token}, cookies=jar, **public
        )
    )
    right = dashboard.handle(
        UIRequest(
            "POST", "login", ROOT, form={"token": "s3cret", "csrf": token}, cookies=jar, **public
        )
    )
    session = dict(right.headers)["set-cookie"].split(";")[0].split("=", 1)[1]
    inside = dashboard.handle(
        UIRequest("GET", "", ROOT, cookies={SESSION_COOKIE: session}, **public)
    )
    bearer = dashboard.handle(
        UIRequest("GET", "", ROOT, headers={"authorization": "Bearer s3cret"}, **public)
    )
    other_token = Dashboard(system, gate=TokenGate("rotated")).handle(
        UIRequest("GET", "", ROOT, cookies={SESSION_COOKIE: session}, **public)
    )

    assert (anonymous.status, dict(anonymous.headers)["location"]) == (303, f"{ROOT}login")
    assert wrong.status == 200 and "not the dashboard token" in wrong.body.decode()
    assert right.status == 303 and "HttpOnly" in dict(right.headers)["set-cookie"]
    assert (inside.status, bearer.status, other_token.status) == (200, 200, 303)


def test_static_files_are_served_and_nothing_else_is(system: LocalSystem) -> None:
    dashboard = Dashboard(system)

    css = get(dashboard, "static/dashboard.css")
    js = get(dashboard, "static/dashboard.js")

    assert css.status == 200 and b".badge" in css.body
    assert js.status == 200 and b"EventSource" in js.body
    assert get(dashboard, "static/../dashboard.py").status == 404


def test_a_waiting_thread_shows_its_pending_call_and_a_parent_its_children() -> None:
    from dormant.demo import TRIAGE
    from examples.family import AGENT as RELEASE

    with LocalSystem([TRIAGE, RELEASE], "memory://") as system:
        waiting = system.launch("triage", "Is build 42 green yet?")
        parent = system.launch("release", "Is release 1.4 ready to ship?")
        system.run_until_idle()
        children = [c.id for c in system.store.children(parent)]
        dashboard = Dashboard(system)
        waiting_page = get(dashboard, "thread", id=waiting).body.decode()
        family_page = get(dashboard, "thread", id=children[0]).body.decode()

    card = waiting_page.split("<h3>Waiting for</h3>")[1].split("</section>")[0]
    assert "<b>run_build</b>" in card and "waiting, unchanged since" in card
    assert "subscribed to <b>watch_pull_requests</b>" in card
    assert 'class="call c-pending" data-call=' in waiting_page
    tree = family_page.split('<ul class="tree">')[1].split("</section>")[0]
    assert all(f">{child}</a>" in tree for child in children)
    assert f'class="mono me" href="/dormant/ui/thread?id={children[0]}"' in tree
    assert f">{parent}</a>" in tree
    assert 'class="bubble user inherited"' in family_page


def test_messages_still_in_the_inbox_show_as_queued_after_the_history(
    system: LocalSystem,
) -> None:
    from dormant.messages import UserMessage
    from dormant.stores.base import NewThread, Priority

    queued = NewThread(
        id="thr_queued",
        agent="echo",
        messages=[("m1", UserMessage(text="are you there?"), Priority.INTERACTIVE)],
    )
    system.store.create_thread(queued)  # stored, never woken: its message waits

    body = get(Dashboard(system), "thread", id="thr_queued").body.decode()

    assert 'class="bubble user queued"' in body
    assert "are you there?" in body.split('class="bubble user queued"')[1]
    assert "No items yet" not in body


def test_dormant_serves_dashboard_takes_its_token_and_actions_from_the_environment() -> None:
    from dormant.http.ui.setup import serve_dashboard
    from dormant.settings import Settings

    env = {"DORMANT_UI_TOKEN": "t0ken", "DORMANT_UI_ACTIONS": "1", "DORMANT_SECRET_KEY": "k"}
    with LocalSystem([], "memory://", settings=Settings.from_env(env)) as configured:
        board = serve_dashboard(configured, "0.0.0.0")
    with LocalSystem([], "memory://", settings=Settings.from_env({})) as plain:
        default = serve_dashboard(plain, "127.0.0.1")

    assert board.gate is not None and board.gate.token == "t0ken" and board.actions
    assert default.gate is not None and default.gate.token == "" and not default.actions


def test_a_thread_page_shows_what_it_spent_and_its_trees_budget(system: LocalSystem) -> None:
    thread_id = system.launch("echo", "hello", budget=Budget(max_tokens=1000))
    system.run_until_idle()
    system.send(thread_id, "again")
    system.run_until_idle()
    body = get(Dashboard(system), "thread", id=thread_id).body.decode()

    usage = body[body.index("<h3>Usage</h3>") :]
    assert "<dt>completions</dt><dd>2</dd>" in usage
    assert "<dt>since user text</dt><dd>1 completions</dd>" in usage
    assert "max_tokens 1000" in usage


def test_thread_state_gives_the_live_view_what_the_store_made_of_the_thread(
    system: LocalSystem,
) -> None:
    from dormant.demo import TRIAGE
    from dormant.messages import UserMessage
    from dormant.stores.base import NewThread, Priority

    with LocalSystem([TRIAGE], "memory://") as triage:
        waiting = triage.launch("triage", "Is build 42 green yet?")
        triage.run_until_idle()
        state = json.loads(get(Dashboard(triage), "thread/state", id=waiting).body)
    queued = NewThread(
        id="thr_queued",
        agent="echo",
        messages=[("m1", UserMessage(text="are you there?"), Priority.INTERACTIVE)],
    )
    system.store.create_thread(queued)  # stored, never woken: its message waits
    inbox = json.loads(get(Dashboard(system), "thread/state", id="thr_queued").body)
    guarded = Dashboard(system, gate=TokenGate("s3cret")).handle(
        UIRequest("GET", "thread/state", ROOT, query={"id": "thr_queued"})
    )
    unknown = get(Dashboard(system), "thread/state", id="thr_nobody")

    assert state["status"] == "waiting" and 'class="badge s-waiting"' in state["facts"]
    assert sorted(state["calls"].values()) == ["pending", "subscribed"]
    assert "<h3>Waiting for</h3>" in state["side"] and state["queued"] == ""
    assert 'class="bubble user queued"' in inbox["queued"]
    assert "are you there?" in inbox["queued"]
    assert guarded.status == 303 and unknown.status == 404


def test_a_thread_shows_the_code_version_that_ran_it_and_each_one_before(tmp_path: Path) -> None:
    """The list says which version ran each thread last; its page lists every version
    that ran it, with the items each made (a deploy met this one)."""
    url = f"sqlite:///{tmp_path}/versions.db"
    v1 = Agent("echo", model=ScriptedModel(answer), version="v1")
    with LocalSystem([v1], url) as old:
        thread_id = old.launch("echo", "hello")
        old.run_until_idle()
    v2 = Agent("echo", model=ScriptedModel(answer), version="v2-<b>")
    with LocalSystem([v2], url) as new:
        new.send(thread_id, "after the deploy")
        new.run_until_idle()
        listing = get(Dashboard(new)).body.decode()
        page = get(Dashboard(new), "thread", id=thread_id).body.decode()
    assert "<td class='mono muted'>v2-&lt;b&gt;</td>" in listing
    assert "code <b class='mono'>v2-&lt;b&gt;</b>" in page
    card = page[page.index("<h3>Code versions</h3>") :]
    assert card.index("v2-&lt;b&gt;</dt><dd>#3 on") < card.index("v1</dt><dd>#1 to #2")
