"""A thread's stream served by a host app behind its own auth: Flask's
``Dormant.stream_response`` and Django's ``stream_response``, each honouring Last-Event-ID,
answering 404 for an unknown thread and ending when the thread closes."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from flask import Flask, abort

from dormant import Agent, LocalSystem, Settings
from dormant.contrib.flask import Dormant
from dormant.models import ScriptedModel, reply
from tests.contrib.projects import REDIS_URL, ROOT


def _closed_thread(database_url: str) -> str:
    """A thread with one exchange, closed, stored at ``database_url``."""
    agent = Agent("support", model=ScriptedModel(lambda history: reply("hello")))
    settings = Settings(secret_keys=("s3cret",))
    with LocalSystem([agent], database_url, settings=settings) as system:
        thread_id = system.launch("support", "hi")
        system.run_until_idle()
        system.close_thread(thread_id, reason="done")
    return thread_id


def _messages(body: bytes) -> list[dict[str, str]]:
    out = []
    for block in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            out.append(fields)
    return out


def test_flask_serves_the_stream_behind_the_apps_own_auth(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'shop.db'}"
    thread_id = _closed_thread(database_url)
    prefix = f"dflask{secrets.token_hex(4)}"
    app = Flask("shop")
    app.config.from_mapping(
        SQLALCHEMY_DATABASE_URI=database_url,
        DORMANT={"SECRET_KEY": "s3cret", "REDIS_URL": REDIS_URL, "KEY_PREFIX": prefix},
    )
    dormant = Dormant(app)

    @app.get("/threads/<thread_id>/events")
    def events(thread_id: str):  # type: ignore[no-untyped-def]
        if not _allowed():  # the host app's own check of its user
            abort(403)
        return dormant.stream_response(thread_id)

    allowed = [True]

    def _allowed() -> bool:
        return allowed[0]

    try:
        web = app.test_client()
        whole = web.get(f"/threads/{thread_id}/events")
        assert whole.status_code == 200
        assert whole.headers["Content-Type"].startswith("text/event-stream")
        messages = _messages(whole.data)
        assert [m["event"] for m in messages] == ["item", "item", "status"]
        assert '"status":"closed"' in messages[-1]["data"]
        rest = web.get(f"/threads/{thread_id}/events", headers={"Last-Event-ID": messages[0]["id"]})
        assert _messages(rest.data) == messages[1:]
        assert web.get("/threads/thr_nobody/events").status_code == 404
        assert web.get(f"/threads/{thread_id}/events?after=nonsense").status_code == 400
        assert web.get(f"/threads/{thread_id}/events?after=999999.0").status_code == 400
        made_up = {"Last-Event-ID": "57.123"}
        assert web.get(f"/threads/{thread_id}/events", headers=made_up).status_code == 400
        allowed[0] = False
        assert web.get(f"/threads/{thread_id}/events").status_code == 403
    finally:
        with app.app_context():
            dormant.client().close()
        conn = redis.Redis.from_url(REDIS_URL)
        keys = list(conn.scan_iter(match=f"{prefix}*"))
        if keys:
            conn.delete(*keys)


_DJANGO_VIEW = """
import sys
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["dormant.contrib.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "shop.db"}},
    DORMANT={"SECRET_KEY": "s3cret", "REDIS_URL": sys.argv[1], "KEY_PREFIX": sys.argv[2]},
)
django.setup()

from celery import Celery
from django.test import RequestFactory

from dormant.contrib.django import close_clients, dormant_client, stream_response

app = Celery("proj", broker="redis://127.0.0.1:1/0", set_as_current=False)
thread_id = sys.argv[3]
requests = RequestFactory()
for path, headers in [
    (f"/t/{thread_id}/events", {}),
    (f"/t/{thread_id}/events", {"HTTP_LAST_EVENT_ID": "2.0"}),
    ("/t/thr_nobody/events", {}),
    (f"/t/{thread_id}/events", {"HTTP_LAST_EVENT_ID": "57.123"}),
    (f"/t/{thread_id}/events?after=999999.0", {}),
]:
    request = requests.get(path, **headers)
    response = stream_response(request, dormant_client(app), path.split("/")[2])
    print("STATUS", response.status_code, response.get("Content-Type"))
    if response.streaming:
        print(b"".join(response.streaming_content).decode())
close_clients()
"""


def test_django_serves_the_stream_from_a_view(tmp_path: Path) -> None:
    pytest.importorskip("django")
    thread_id = _closed_thread(f"sqlite:///{tmp_path / 'shop.db'}")
    prefix = f"ddjango{secrets.token_hex(4)}"
    result = subprocess.run(
        [sys.executable, "-c", _DJANGO_VIEW, REDIS_URL, prefix, thread_id],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    parts = result.stdout.split("STATUS ")[1:]
    assert [p.split("\n", 1)[0] for p in parts] == [
        "200 text/event-stream; charset=utf-8",
        "200 text/event-stream; charset=utf-8",
        "404 text/html; charset=utf-8",
        "400 text/html; charset=utf-8",
        "400 text/html; charset=utf-8",
    ]
    whole, rest = _messages(parts[0].encode()), _messages(parts[1].encode())
    assert [m["event"] for m in whole] == ["item", "item", "status"]
    assert rest == whole[1:]
    conn = redis.Redis.from_url(REDIS_URL)
    keys = list(conn.scan_iter(match=f"{prefix}*"))
    if keys:
        conn.delete(*keys)
