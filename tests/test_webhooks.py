"""The webhook receiver: a signed delivery becomes one event; every refusal changes nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.errors import ConfigurationError, InvalidToken
from dormant.http.tokens import callback_url, parse_callback_url
from dormant.http.webhooks import (
    WebhookReceiver,
    WebhookSource,
    flask_blueprint,
    github_source,
    webhook_url,
)
from dormant.messages import EventShown, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.settings import Settings

SECRET = "gh-secret"
urls: dict[str, str] = {}


@tool(subscription=True)
def watch_pull_requests(repo: str, ctx: ToolContext) -> str:
    """Watch a repository's pull requests."""
    urls["watch"] = webhook_url(ctx.callback_url, "github")
    return "watching"


def script(items: list[object]) -> object:
    last = items[-1]
    if isinstance(last, UserText) and last.text == "stop watching":
        (watch,) = [
            i for i in items if isinstance(i, ToolResult) and i.name == "watch_pull_requests"
        ]
        return reply("", call("cancel_subscription", call_id=watch.call_id))
    if isinstance(last, UserText):
        return reply("", call("watch_pull_requests", repo="acme/app"))
    return reply("noted")


@dataclass
class Rig:
    system: LocalSystem
    receiver: WebhookReceiver
    thread_id: str
    path: str
    query: str
    now_s: float = 1_800_000_000.0


NOW_S = Rig.now_s


@pytest.fixture
def rig() -> Iterator[Rig]:
    agent = Agent("watcher", model=ScriptedModel(script), tools=[watch_pull_requests])  # type: ignore[arg-type]
    settings = Settings(
        max_message_bytes=4096,
        secret_keys=("k1",),
        callback_base_url="https://hooks.example/dormant/callbacks",
    )
    with LocalSystem([agent], "memory://", settings=settings) as system:
        thread_id = system.launch("watcher", "watch acme/app")
        system.run_until_idle()
        url = urls["watch"]
        assert url.startswith("https://hooks.example/dormant/webhooks/github/")
        tail, _, query = url.removeprefix("https://hooks.example/dormant/webhooks/").partition("?")
        stamped = WebhookSource(
            "stamped", (SECRET,), signature_header="X-Signature", timestamp_header="X-Timestamp"
        )
        receiver = WebhookReceiver(
            system, [github_source(["old", SECRET]), stamped], clock=lambda: NOW_S
        )
        yield Rig(system, receiver, thread_id, tail, query)


def signed(body: bytes, key: str = SECRET, **extra: str) -> dict[str, str]:
    mac = hmac.new(key.encode(), body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": f"sha256={mac}",
        "X-GitHub-Delivery": "d-1",
        "X-GitHub-Event": "pull_request",
        **extra,
    }


PR = json.dumps({"action": "opened", "pull_request": {"title": "Fix flaky build"}}).encode()


def test_a_signed_github_delivery_becomes_an_event_the_agent_sees(rig: Rig) -> None:
    answer = rig.receiver.receive(rig.path, rig.query, signed(PR), PR)
    assert answer.status == 202 and answer.body["message_id"] == "github:d-1"
    rig.system.run_until_idle()
    shown = [
        item
        for info in rig.system.threads()
        for item in rig.system.history(info.id)
        if isinstance(item, EventShown)
    ]
    assert len(shown) == 1
    event = json.loads(shown[0].content)
    assert event["event"] == "pull_request" and event["delivery"] == "d-1"
    assert event["payload"]["pull_request"]["title"] == "Fix flaky build"


def test_a_redelivery_is_a_harmless_duplicate(rig: Rig) -> None:
    assert rig.receiver.receive(rig.path, rig.query, signed(PR), PR).status == 202
    before = [row.message_id for row in rig.system.store.inbox(rig.thread_id)]
    again = rig.receiver.receive(rig.path, rig.query, signed(PR), PR)
    assert again.status == 409 and again.body["status"] == "duplicate"
    # No new row (the running system may meanwhile have applied the first: compare ids).
    assert [row.message_id for row in rig.system.store.inbox(rig.thread_id)] == before


def test_a_delivery_for_a_closed_thread_is_refused_with_409_and_the_reason(rig: Rig) -> None:
    rig.system.close_thread(rig.thread_id, reason="unsubscribed by the user")

    answer = rig.receiver.receive(rig.path, rig.query, signed(PR), PR)

    assert answer.status == 409
    assert "unsubscribed by the user" in answer.body["error"]
    assert rig.system.store.inbox(rig.thread_id)[-1].message_id != "github:d-1"


def test_a_timestamped_source_accepts_a_fresh_signed_delivery(rig: Rig) -> None:
    stamp = str(int(rig.now_s) - 10)
    mac = hmac.new(SECRET.encode(), stamp.encode() + b"." + PR, hashlib.sha256).hexdigest()
    headers = {
        "content-type": "application/json; charset=utf-8",
        "x-signature": f"sha256={mac}",
        "x-timestamp": stamp,
        "x-github-delivery": "t-1",
    }
    path = rig.path.replace("github/", "stamped/", 1)
    assert rig.receiver.receive(path, rig.query, headers, PR).status == 202


def _stamped(rig: Rig, at_s: float | str, body: bytes = PR) -> tuple[str, dict[str, str]]:
    stamp = at_s if isinstance(at_s, str) else str(int(at_s))
    mac = hmac.new(SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-Signature": f"sha256={mac}",
        "X-Timestamp": stamp,
        "X-GitHub-Delivery": "t-2",
    }
    return rig.path.replace("github/", "stamped/", 1), headers


@pytest.mark.parametrize(
    ("case", "status", "reason"),
    [
        ("forged", 401, "does not match the body"),
        ("altered", 401, "does not match the body"),
        ("unsigned", 401, "missing X-Hub-Signature-256"),
        ("unprefixed", 401, "X-Hub-Signature-256 must be sha256=<hex>, not 'a1b2'"),
        ("expired", 401, "expired"),
        ("no-timestamp", 401, "X-Timestamp"),
        ("nan-timestamp", 401, "bad X-Timestamp"),
        ("infinite-timestamp", 401, "bad X-Timestamp"),
        ("exponent-timestamp", 401, "bad X-Timestamp"),
        ("deeply-nested", 400, "nested too deeply"),
        ("oversized", 413, "the limit is 4096"),
        ("non-utf8", 400, "not UTF-8"),
        ("not-json", 400, "not JSON"),
        ("form-encoded", 415, "application/json"),
        ("unknown-source", 404, "unknown webhook source 'gitlab'"),
        ("bad-token", 403, "does not match call"),
        ("no-token", 404, "not a webhook URL"),
        ("no-delivery-id", 400, "missing X-GitHub-Delivery"),
    ],
)
def test_a_bad_delivery_is_refused_with_a_reason_and_changes_nothing(
    rig: Rig, case: str, status: int, reason: str
) -> None:
    path, query, body = rig.path, rig.query, PR
    headers = signed(body)
    if case == "forged":
        headers = signed(body, key="guess")
    elif case == "altered":
        body = PR.replace(b"opened", b"closed")
    elif case == "unsigned":
        del headers["X-Hub-Signature-256"]
    elif case == "unprefixed":  # present, without the "sha256=" GitHub puts before the hex
        headers["X-Hub-Signature-256"] = "a1b2"
    elif case == "expired":
        path, headers = _stamped(rig, rig.now_s - 301)
    elif case == "no-timestamp":
        path, headers = _stamped(rig, rig.now_s)
        del headers["X-Timestamp"]
    elif case == "nan-timestamp":  # signed: only "never too far from now" could stop it
        path, headers = _stamped(rig, "nan")
    elif case == "infinite-timestamp":
        path, headers = _stamped(rig, "-inf")
    elif case == "exponent-timestamp":  # float() reads it as now, but it is not Unix seconds
        path, headers = _stamped(rig, f"{rig.now_s:e}")
    elif case == "deeply-nested":
        body = b"[" * 2000 + b"]" * 2000
        headers = signed(body)
    elif case == "oversized":
        body = json.dumps({"blob": "x" * 5000}).encode()
        headers = signed(body)
    elif case == "non-utf8":
        body = b'{"title": "caf\xe9"}'
        headers = signed(body)
    elif case == "not-json":
        body = b"payload=%7B%7D"
        headers = signed(body)
    elif case == "form-encoded":
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    elif case == "unknown-source":
        path = path.replace("github/", "gitlab/", 1)
    elif case == "bad-token":
        query = query[:-2] + "xx"
    elif case == "no-token":
        query = ""
    elif case == "no-delivery-id":
        del headers["X-GitHub-Delivery"]
    before = rig.system.store.inbox(rig.thread_id)
    answer = rig.receiver.receive(path, query, headers, body)
    assert answer.status == status, answer.body
    assert reason in answer.body["error"]
    assert rig.system.store.inbox(rig.thread_id) == before


def test_a_delivery_for_another_call_does_not_verify(rig: Rig) -> None:
    thread, call_id = rig.path.split("/")[1:]
    path = f"github/{thread}/not-{call_id}"
    answer = rig.receiver.receive(path, rig.query, signed(PR), PR)
    assert answer.status == 403 and "does not match call" in answer.body["error"]


def test_a_source_without_a_secret_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="'github' has no secret key"):
        github_source([])


def test_webhook_url_needs_a_callbacks_base() -> None:
    with pytest.raises(ConfigurationError, match="/callbacks base"):
        webhook_url("https://h/cb/t1/c1?token=1.x", "github")


def test_webhook_secrets_are_read_from_the_environment() -> None:
    env = {"DORMANT_WEBHOOK_SECRETS": "github=a,b; stripe=c"}
    assert Settings.from_env(env).webhook_secrets == (("github", ("a", "b")), ("stripe", ("c",)))
    with pytest.raises(ConfigurationError, match="DORMANT_WEBHOOK_SECRETS"):
        Settings.from_env({"DORMANT_WEBHOOK_SECRETS": "github"})


def test_the_flask_blueprint_mounts_the_receiver(rig: Rig) -> None:
    flask = pytest.importorskip("flask")
    app = flask.Flask("hooks")
    app.register_blueprint(flask_blueprint(rig.receiver), url_prefix="/dormant/webhooks")
    url = f"/dormant/webhooks/{rig.path}?{rig.query}"
    with app.test_client() as http:
        answer = http.post(url, data=PR, headers=signed(PR))
        assert answer.status_code == 202 and answer.json == {
            "status": "queued",
            "message_id": "github:d-1",
        }
        forged = http.post(url, data=PR, headers=signed(PR, key="guess"))
        assert forged.status_code == 401


def test_ids_holding_a_slash_or_a_percent_sign_survive_the_flask_blueprint(rig: Rig) -> None:
    """Flask hands the view a decoded path: the blueprint reads the path as sent instead, so
    an encoded "/" stays inside the id and "%41" is not decoded a second time into "A"."""
    flask = pytest.importorskip("flask")
    app = flask.Flask("hooks")
    app.register_blueprint(flask_blueprint(rig.receiver), url_prefix="/dormant/webhooks")
    for thread_id in ("team/a%b", "50%41 off"):
        rig.system.launch("watcher", "watch acme/app", thread_id=thread_id)
        rig.system.run_until_idle()
        url = urls["watch"].removeprefix("https://hooks.example")
        assert parse_callback_url(url)[0] == thread_id
        with app.test_client() as http:
            answer = http.post(url, data=PR, headers=signed(PR, **{"X-GitHub-Delivery": thread_id}))
        assert answer.status_code == 202, answer.json
        assert [row.message_id for row in rig.system.store.inbox(thread_id)][-1] == (
            f"github:{thread_id}"
        )


def test_a_webhook_url_outlives_its_tokens_expiry_but_not_its_subscription(rig: Rig) -> None:
    """The decision in docs/security.md: GitHub keeps one URL for as long as the hook
    exists, so a webhook URL does not expire; cancelling the subscription ends it."""
    thread_id, call_id, _ = parse_callback_url(urls["watch"])
    keys = rig.system.settings.secret_keys
    base = rig.system.settings.callback_base_url
    expired_callback = callback_url(base, keys, thread_id, call_id, expires_at_s=1)
    with pytest.raises(InvalidToken, match="expired"):
        rig.system.deliver_callback(expired_callback, "a callback with this token is refused")
    hook = webhook_url(expired_callback, "github")
    tail, _, query = hook.removeprefix("https://hooks.example/dormant/webhooks/").partition("?")
    assert rig.receiver.receive(tail, query, signed(PR), PR).status == 202

    rig.system.send(thread_id, "stop watching")
    rig.system.run_until_idle()
    later = rig.receiver.receive(tail, query, signed(PR, **{"X-GitHub-Delivery": "d-2"}), PR)
    assert later.status == 409 and "cancelled" in later.body["error"], later.body
