"""Headless Chromium for the browser tests, and ASGI apps served on a free loopback port.

Chromium is Debian's (``apt-get install -y chromium``), driven by Playwright with no browser
download. It starts with the flags this machine needs (no background networking, which the
closed network refuses) and Playwright's own new, empty profile. Without it the browser
tests are skipped loudly, except in CI (``CI=true``), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn

CHROMIUM = os.environ.get("DORMANT_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the browser tests need Chromium in CI: {reason}")
    pytest.skip(f"!!! CHROMIUM UNAVAILABLE, browser tests NOT RUN: {reason}")


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a Playwright ``Browser``)."""
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        _missing(f"no {CHROMIUM} (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        _missing(f"playwright is not installed: {error}")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serving(app: Any, host: str = "127.0.0.1", port: int | None = None) -> Iterator[str]:
    """``app`` (ASGI) under uvicorn on a thread of this process (on ``port``, or a free
    one); yields ``http://host:port``."""
    port = port or free_port()
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="off", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn exited while starting"
        assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
        time.sleep(0.02)  # waiting for the port to open, not for work
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def growing_lengths(page: Any, wanted: int, start: int = 0) -> list[int]:
    """The streaming bubble's text length, each time it has grown past the last one (the
    first time, past ``start``), ``wanted`` times."""
    seen: list[int] = []
    while len(seen) < wanted:
        page.wait_for_function(
            "n => { const t = document.querySelector('.bubble.streaming .text');"
            " return t && t.textContent.length > n; }",
            arg=seen[-1] if seen else start,
            timeout=20_000,
        )
        seen.append(
            page.evaluate("document.querySelector('.bubble.streaming .text').textContent.length")
        )
    return seen
