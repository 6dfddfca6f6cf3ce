"""One-click approval links in ``dormant serve``: a GET decides nothing, only the page's
POST does; a forged, altered, expired or replayed link is refused."""

from __future__ import annotations

import asyncio
import threading
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from dormant import Agent
from dormant.errors import NotAwaitingApproval
from dormant.http.approval_links import with_links
from dormant.http.callbacks import callback_app
from dormant.http.dev_server import make_dev_server
from dormant.http.serve import asgi_app
from dormant.http.tokens import callback_url
from dormant.http.webhooks import WebhookReceiver
from dormant.messages import ApprovalDecision
from dormant.settings import Settings
from dormant.stores.base import Store
from tests.browser import free_port
from tests.harness import Harness, results
from tests.test_approvals import RAN, _refund_and_lookup, _script, lookup, refund


@pytest.fixture(autouse=True)
def _clear_runs() -> None:
    RAN.clear()


def _held(store: Store) -> tuple[Harness, str]:
    agent = Agent("clerk", model=_script(_refund_and_lookup()), tools=[refund, lookup])
    h = Harness(agent, store=store)
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    return h, t


def _request(
    h: Harness, method: str, url: str, form: dict[str, str] | None = None
) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=asgi_app(h, WebhookReceiver(h, [])))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            parts = urlsplit(url)
            target = f"{parts.path}?{parts.query}"
            return await http.request(method, target, data=form)

    return asyncio.run(go())


def _decisions(h: Harness, t: str) -> list[ApprovalDecision]:
    return [i for i in h.history(t) if isinstance(i, ApprovalDecision)]


def _queued(h: Harness, t: str) -> list[str]:
    return [r.message_id for r in h.store.inbox(t) if r.message_id.startswith("approval:")]


def test_a_get_shows_the_call_and_decides_nothing(store: Store) -> None:
    h, t = _held(store)
    links = h.approval_links(t, "c_refund", by="alice@example.com")
    assert set(links) == {"approve", "reject"}
    page = _request(h, "GET", links["approve"])
    assert page.status_code == 200
    assert "Refund 250.0 to o1?" in page.text and "o1" in page.text
    assert 'method="post"' in page.text and "Approve as alice@example.com" in page.text
    assert page.headers["cache-control"] == "no-store"
    assert page.headers["referrer-policy"] == "no-referrer"
    _request(h, "GET", links["reject"])
    assert _queued(h, t) == [] and len(h.pending_approvals()) == 1


def test_the_post_decides_once_and_a_replay_is_already_decided(store: Store) -> None:
    h, t = _held(store)
    links = h.approval_links(t, "c_refund", by="alice@example.com")
    done = _request(h, "POST", links["approve"])
    assert done.status_code == 200 and "Approved" in done.text
    replay = _request(h, "POST", links["approve"])
    assert replay.status_code == 409 and "already decided" in replay.text
    other = _request(h, "POST", links["reject"])
    assert other.status_code == 409
    h.settle(t)
    [made] = _decisions(h, t)
    assert (made.decision, made.by, made.channel) == ("approve", "alice@example.com", "link")
    assert [name for name, _ in RAN].count("refund") == 1
    assert len([r for r in results(h.history(t)) if r.call_id == "c_refund"]) == 1


def test_a_reject_link_carries_the_reason_typed_on_its_page(store: Store) -> None:
    h, t = _held(store)
    links = h.approval_links(t, "c_refund", by="bob")
    assert 'name="reason"' in _request(h, "GET", links["reject"]).text
    assert _request(h, "POST", links["reject"], {"reason": "wrong order"}).status_code == 200
    h.settle(t)
    [result] = [r for r in results(h.history(t)) if r.call_id == "c_refund"]
    assert "rejected by bob: wrong order" in result.content


def _altered(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    path = parts.path
    if "decision" in changes:
        path = path.rsplit("/", 1)[0] + "/" + changes.pop("decision")
    query.update(changes)
    return f"{parts.scheme}://{parts.netloc}{path}?{urlencode(query)}"


@pytest.mark.parametrize(
    "change",
    [
        {"token": "9999999999.forged"},
        {"by": "mallory"},
        {"digest": "0" * 32},
        {"decision": "reject"},
        {"decision": "edit"},
    ],
)
def test_a_forged_or_altered_link_is_refused_and_decides_nothing(change: dict[str, str]) -> None:
    from dormant.stores.memory.store import MemoryStore

    h, t = _held(MemoryStore())
    link = h.approval_links(t, "c_refund", by="alice")["approve"]
    for method in ("GET", "POST"):
        refused = _request(h, method, _altered(link, **change))
        assert refused.status_code == 403, refused.text
        assert "not valid" in refused.text
    assert _queued(h, t) == []


def test_an_expired_link_and_a_callback_token_are_refused(store: Store) -> None:
    h, t = _held(store)
    expired = h.approval_links(t, "c_refund", by="alice", ttl_s=-60)["approve"]
    assert _request(h, "POST", expired).status_code == 403
    keys = h.settings.secret_keys
    good = h.approval_links(t, "c_refund", by="alice")["approve"]
    callback = callback_url("http://x/dormant/callbacks", keys, t, "c_refund", 2_000_000_000)
    token = parse_qs(urlsplit(callback).query)["token"][0]
    assert _request(h, "POST", _altered(good, token=token)).status_code == 403
    assert _queued(h, t) == []
    assert _request(h, "PUT", good).status_code == 405


def test_links_exist_only_for_calls_that_await_approval(store: Store) -> None:
    h, t = _held(store)
    with pytest.raises(NotAwaitingApproval):
        h.approval_links(t, "c_lookup", by="alice")


def test_a_link_used_after_another_channel_decided_is_refused(store: Store) -> None:
    h, t = _held(store)
    links = h.approval_links(t, "c_refund", by="alice")
    h.edit(t, "c_refund", {"order_id": "o1", "amount": 10.0}, by="carol")
    h.settle(t)
    refused = _request(h, "POST", links["approve"])
    assert refused.status_code == 409
    assert [name for name, _ in RAN].count("refund") == 1  # the edited run only


def test_dormant_callbacks_answers_the_links_the_default_callback_base_makes(
    store: Store,
) -> None:
    """The default ``DORMANT_CALLBACK_BASE_URL`` is ``dormant callbacks``' port: the links it
    makes are answered there (GET shows, POST decides), and callbacks still pass through."""
    port = free_port()
    settings = Settings(callback_base_url=f"http://127.0.0.1:{port}/dormant/callbacks")
    agent = Agent("clerk", model=_script(_refund_and_lookup()), tools=[refund, lookup])
    h = Harness(agent, store=store, settings=settings)
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    links = h.approval_links(t, "c_refund", by="alice@example.com")
    with make_dev_server("127.0.0.1", port, with_links(h, callback_app(h))) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            page = httpx.get(links["approve"], timeout=30)
            done = httpx.post(links["approve"], data={"reason": "checked"}, timeout=30)
            callback = httpx.get(f"http://127.0.0.1:{port}/dormant/callbacks/x/y", timeout=30)
        finally:
            server.shutdown()
    assert page.status_code == 200 and "Refund 250.0 to o1?" in page.text
    assert done.status_code == 200 and "Approved" in done.text
    assert callback.status_code == 405  # the callback receiver's own answer
    h.settle(t)
    [made] = _decisions(h, t)
    assert (made.decision, made.by, made.reason) == ("approve", "alice@example.com", "checked")
