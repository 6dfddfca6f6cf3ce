"""The dashboard's page comparing the replays of a tag (``http/ui/replays.py``)."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from urllib.parse import parse_qsl, urlsplit

import pytest

from dormant import Agent, LocalSystem
from dormant.http.ui import replays
from dormant.http.ui.dashboard import Dashboard, UIRequest
from dormant.messages import Item, UserText
from dormant.models import ScriptedModel, reply
from dormant.models.base import Completion
from dormant.models.registry import register_provider
from dormant.stores.base import NewThread

ROOT = "/dormant/ui/"


def _echo(items: Sequence[Item]) -> Completion:
    last = items[-1]
    return reply(f"echo: {last.text if isinstance(last, UserText) else '?'}")


def _shout(items: Sequence[Item]) -> Completion:
    last = items[-1]
    return reply(f"ECHO: {last.text.upper() if isinstance(last, UserText) else '?'}")


def test_the_replays_page_compares_each_replay_of_a_tag_with_its_source() -> None:
    register_provider("dash", lambda name: ScriptedModel(_shout if name == "shout" else _echo))
    with LocalSystem([Agent("echo", model=ScriptedModel(_echo))], "memory://") as system:
        sources = [system.launch("echo", text) for text in ("<b>hi</b>", "there")]
        system.run_until_idle()
        same = system.replay(sources[0], model="dash:echo", tag="exp<1>")
        louder = system.replay(sources[1], model="dash:shout", tag="exp<1>")
        system.replay(sources[1], model="dash:echo", tag="other")
        system.run_until_idle()
        page = Dashboard(system).handle(UIRequest("GET", "replays", ROOT, query={"tag": "exp<1>"}))

    body = page.body.decode()
    assert page.status == 200
    assert "2 replays: 1 same, 1 diverged" in body
    assert f'data-same="true"><td><a class="mono" href="{ROOT}thread?id={same}"' in body
    assert f'data-same="false"><td><a class="mono" href="{ROOT}thread?id={louder}"' in body
    assert "ECHO: THERE" in body and "&lt;b&gt;hi&lt;/b&gt;" in body and "<b>hi" not in body
    assert body.count("<tr data-same=") == 2  # not the other tag's replay


def test_the_replays_page_finds_a_tag_s_replays_by_tag_whatever_their_age_paged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replays, "PAGE_SIZE", 2)
    register_provider("dash", lambda name: ScriptedModel(_shout if name == "shout" else _echo))
    with LocalSystem([Agent("echo", model=ScriptedModel(_echo))], "memory://") as system:
        source = system.launch("echo", "hello")
        system.run_until_idle()
        made = [system.replay(source, model="dash:echo", tag="old") for _ in range(3)]
        system.run_until_idle()
        for n in range(2_001):  # newer production threads bury the replays
            system.store.create_thread(NewThread(id=f"thr_new_{n:05}", agent="echo"))
        dashboard = Dashboard(system)
        first = dashboard.handle(UIRequest("GET", "replays", ROOT, query={"tag": "old"}))
        body = first.body.decode()
        older = re.search(r'<a class="older" href="([^"]+)"', body)
        assert older is not None
        query = dict(parse_qsl(urlsplit(html.unescape(older[1])).query))
        second = dashboard.handle(UIRequest("GET", "replays", ROOT, query=query)).body.decode()

    assert "2 replays on this page: 2 same, 0 diverged" in body
    assert [m for m in made if f"?id={m}" in body] == made[1:]  # newest first
    assert "1 replays on this page: 1 same, 0 diverged" in second
    assert f"?id={made[0]}" in second and 'class="older"' not in second
