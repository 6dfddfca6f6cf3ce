"""The dashboard mounted in Flask and in Django, behind the host app's own auth."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask, request
from werkzeug.serving import make_server

from dormant import Agent, LocalSystem
from dormant.contrib.dashboard import flask_blueprint
from dormant.models import ScriptedModel, SimulatedModel, reply
from dormant.stores.base import ThreadStatus
from tests.browser import chromium, growing_lengths

ROOT = Path(__file__).resolve().parent.parent.parent
ECHO = Agent("echo", model=ScriptedModel(lambda items: reply("hello back")))


@pytest.fixture
def system() -> Iterator[LocalSystem]:
    with LocalSystem([ECHO], "memory://") as system:
        yield system


def test_flask_shows_the_dashboard_to_whom_allow_admits_and_runs_its_actions(
    system: LocalSystem,
) -> None:
    thread_id = system.launch("echo", "hi", thread_id="thr_flask")
    system.run_until_idle()
    app = Flask(__name__)
    allow = lambda: request.headers.get("X-Operator") == "yes"  # noqa: E731
    app.register_blueprint(
        flask_blueprint(lambda: system, allow=allow, actions=True), url_prefix="/ops/dormant"
    )
    web = app.test_client()
    operator = {"X-Operator": "yes"}

    refused = web.get("/ops/dormant/")
    listing = web.get("/ops/dormant/", headers=operator)
    page = web.get(f"/ops/dormant/thread?id={thread_id}", headers=operator)
    token = re.findall(r'name="csrf" value="([0-9a-f]+)"', page.get_data(as_text=True))[0]
    form = {"id": thread_id, "csrf": token, "reason": "from flask"}
    forged = web.post("/ops/dormant/thread/close", data={**form, "csrf": "0"}, headers=operator)
    closed = web.post("/ops/dormant/thread/close", data=form, headers=operator)

    assert refused.status_code == 403
    assert listing.status_code == 200 and f'data-thread="{thread_id}"' in listing.get_data(True)
    assert 'href="/ops/dormant/static/dashboard.css"' in listing.get_data(as_text=True)
    assert forged.status_code == 403
    assert closed.status_code == 303
    assert closed.headers["Location"] == f"/ops/dormant/thread?id={thread_id}"
    assert system.thread(thread_id).status is ThreadStatus.CLOSED
    live = web.get(f"/ops/dormant/thread?id={thread_id}", headers=operator).get_data(True)
    assert f'data-stream="/ops/dormant/thread/events?id={thread_id}"' in live
    events = web.get(f"/ops/dormant/thread/events?id={thread_id}", headers=operator)
    assert events.mimetype == "text/event-stream"
    sent = events.get_data(as_text=True)  # the thread is closed: the stream ends
    assert "event: item" in sent and '"status":"closed"' in sent
    assert web.get(f"/ops/dormant/thread/events?id={thread_id}").status_code == 403


class _Anonymous:
    """What flask-login's ``current_user`` is before a login: it has no ``is_admin``."""


class _Admin:
    is_admin = True


def test_a_flask_allow_that_raises_denies_with_403_and_is_logged(
    system: LocalSystem, caplog: pytest.LogCaptureFixture
) -> None:
    app = Flask(__name__)
    users = {"admin": _Admin()}

    def current_user() -> object:
        return users.get(request.headers.get("X-User", ""), _Anonymous())

    allow = lambda: current_user().is_admin  # type: ignore[attr-defined]  # noqa: E731
    app.register_blueprint(flask_blueprint(lambda: system, allow=allow), url_prefix="/ops")
    web = app.test_client()

    with caplog.at_level("WARNING", logger="dormant.ui"):
        anonymous = web.get("/ops/")
    admin = web.get("/ops/", headers={"X-User": "admin"})

    assert anonymous.status_code == 403
    assert admin.status_code == 200
    assert "AttributeError" in caplog.text and "denied" in caplog.text


def test_a_flask_mount_shows_a_live_answer_token_by_token_in_a_browser() -> None:
    slow = SimulatedModel(completion_chars=200, chunk_chars=5, chunk_delay_s=0.08)
    with LocalSystem([Agent("writer", model=slow)], "memory://") as system:
        app = Flask(__name__)
        app.register_blueprint(
            flask_blueprint(lambda: system, allow=lambda: True), url_prefix="/ops/dormant"
        )
        server = make_server("127.0.0.1", 0, app, threaded=True)
        serving = threading.Thread(target=server.serve_forever, daemon=True)
        serving.start()
        try:
            with chromium() as browser:
                page = browser.new_page()
                thread_id = system.launch("writer", "draft it", thread_id="thr_flask_live")
                page.goto(f"http://127.0.0.1:{server.port}/ops/dormant/thread?id={thread_id}")
                lengths = growing_lengths(page, wanted=3)
                page.wait_for_selector("li.bubble.assistant[data-seq='2']", timeout=30_000)
                page.close()
        finally:
            server.shutdown()
        system.run_until_idle()

    assert lengths == sorted(lengths) and len(set(lengths)) == 3


DJANGO_SCRIPT = """
import html
import re
import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="test",
    ALLOWED_HOSTS=["testserver"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[
        "django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions"
    ],
    MIDDLEWARE=[
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    LOGIN_URL="/login/",
)
django.setup()

from django.core.management import call_command
from django.contrib.auth.models import User
from django.test import Client
from django.urls import re_path

from dormant import Agent, LocalSystem
from dormant.contrib.dashboard import django_view
from dormant.models import ScriptedModel, SimulatedModel, reply

from dormant import tool
from dormant.messages import UserText
from dormant.models import call


@tool(approval=True)
def refund(order_id: str) -> str:
    '''Refund an order.'''
    return f"refunded {order_id}"


def clerk(items):
    if isinstance(items[-1], UserText):
        return reply("", call("refund", order_id="o1"))
    return reply(f"done: {items[-1].content}")


system = LocalSystem(
    [
        Agent("echo", model=ScriptedModel(lambda items: reply("hi"))),
        Agent("clerk", model=ScriptedModel(clerk), tools=[refund]),
    ],
    "memory://",
)
def broken_allow(request):
    return request.user.profile.is_admin  # no profile model: AttributeError


urlpatterns = [
    re_path(r"^dormant/ui/(?P<path>.*)$", django_view(lambda: system, actions=True)),
    re_path(r"^broken/(?P<path>.*)$", django_view(lambda: system, allow=broken_allow)),
]
call_command("migrate", verbosity=0)
thread_id = system.launch("echo", "hello", thread_id="thr_django")
system.run_until_idle()

web = Client(enforce_csrf_checks=True)
anonymous = web.get("/dormant/ui/")
print("anonymous", anonymous.status_code, anonymous["Location"])
web.force_login(User.objects.create_user("clerk", password="x"))
print("clerk", web.get("/dormant/ui/").status_code)
web.force_login(User.objects.create_user("ops", password="x", is_staff=True))
listing = web.get("/dormant/ui/")
print("staff", listing.status_code, 'data-thread="thr_django"' in listing.content.decode())
print("raising allow", web.get("/broken/").status_code)
page = web.get("/dormant/ui/thread", {"id": thread_id}).content.decode()
token = re.findall(r'name="csrf" value="([0-9a-f]+)"', page)[0]
form = {"id": thread_id, "csrf": token, "reason": "from django"}
print("forged", web.post("/dormant/ui/thread/close", {**form, "csrf": "0"}).status_code)
closed = web.post("/dormant/ui/thread/close", form)
print("closed", closed.status_code, system.thread(thread_id).status.value)
events = web.get("/dormant/ui/thread/events", {"id": thread_id})
sent = b"".join(events.streaming_content).decode()
print("events", events["Content-Type"], "event: item" in sent, '"status":"closed"' in sent)
system.launch("clerk", "refund o1", thread_id="thr_refund")
system.run_until_idle()
queue = web.get("/dormant/ui/approvals").content.decode()
start = queue.index('name="decision" value="approve"')
approve_form = queue[queue.rindex("<form", 0, start) : start]
fields = re.findall(r'name="([a-z_]+)" value="([^"]*)"', approve_form)
form = {name: html.unescape(value) for name, value in fields} | {"decision": "approve"}
forged = web.post("/dormant/ui/approvals/decide", {**form, "csrf": "0"})
print("queue", "refund" in queue, "forged", forged.status_code)
print("approved", web.post("/dormant/ui/approvals/decide", {**form, "by": "ops"}).status_code)
system.run_until_idle()
print("ran", system.history("thr_refund")[-1].text)
system.close()
"""


def test_django_shows_the_dashboard_to_staff_and_checks_its_own_csrf(tmp_path: Path) -> None:
    """Its thread pages and its approval queue, behind the host's login and staff check."""
    script = tmp_path / "django_dashboard.py"
    script.write_text(textwrap.dedent(DJANGO_SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "anonymous 302 /login/?next=/dormant/ui/",
        "clerk 403",
        "staff 200 True",
        "raising allow 403",
        "forged 403",
        "closed 303 closed",
        "events text/event-stream; charset=utf-8 True True",
        "queue True forged 403",
        "approved 303",
        "ran done: refunded o1",
    ]
