"""The example projects' chat page in headless Chromium: an answer streams in token by
token, the page is reloaded mid-answer, and it resumes where it was."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from tests.browser import chromium

PARTIAL = "#log li.agent.partial"
DONE = "#log li.agent:not(.partial)"


@dataclass(frozen=True)
class ChatRun:
    lengths: list[int]
    """The streaming answer's length each time it grew, before the reload."""
    restored: int
    """The partial answer's length on the reloaded page before its stream reconnected."""
    answers: list[str]
    """The finished answers on the page."""
    stored: str
    """The thread's last assistant text, from the app's JSON view."""
    stream_urls: list[str]


def _partial_length(page: Any) -> int:
    found: int = page.evaluate(
        f"(() => {{ const li = document.querySelector('{PARTIAL}'); "
        "return li ? li.textContent.length : 0; })()"
    )
    return found


def chat_and_reload(base: str, question: str) -> ChatRun:
    """Ask on ``base``/chat/, reload once the answer has grown three times, wait for it."""
    with chromium() as browser:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        urls: list[str] = []
        page.on(
            "request",
            lambda r: (
                urls.append(r.url) if r.url.endswith("events") or "/events?" in r.url else None
            ),
        )
        page.goto(f"{base}/chat/")
        page.fill("input[name=text]", question)
        page.click("button[type=submit]")
        lengths: list[int] = []
        while len(lengths) < 3:
            page.wait_for_function(
                f"n => {{ const li = document.querySelector('{PARTIAL}');"
                " return li && li.textContent.length > n; }",
                arg=lengths[-1] if lengths else 0,
                timeout=60_000,
            )
            lengths.append(_partial_length(page))
        # The reloaded page must rebuild itself from what it saved, and its new stream must
        # start right after the last event it saw.
        page.reload(wait_until="domcontentloaded")
        restored = _partial_length(page)
        page.wait_for_selector(DONE, timeout=60_000)
        answers = page.eval_on_selector_all(DONE, "els => els.map(e => e.textContent)")
        thread_id = page.evaluate("JSON.parse(sessionStorage.getItem('dormant-chat')).thread")
        page.close()
    assert errors == []
    history = httpx.get(f"{base}/threads/{thread_id}/", timeout=30).json()["history"]
    stored = [i["text"] for i in history if i["kind"] == "assistant"][-1]
    return ChatRun(lengths, restored, answers, stored, urls)


def assert_resumed(run: ChatRun) -> None:
    assert run.lengths == sorted(run.lengths) and len(set(run.lengths)) == 3
    assert run.restored >= run.lengths[-1]  # the reload kept what was on the screen
    assert run.answers == [run.stored]  # once, whole: nothing missed, nothing twice
    assert len(run.stream_urls) >= 2 and "after=" in run.stream_urls[-1]
