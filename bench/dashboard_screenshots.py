"""The screenshots of docs/monitoring.md: the dashboard over a small fleet, in headless Chromium.

    .venv/bin/python bench/dashboard_screenshots.py     # writes docs/dashboard-*.png

The fleet runs in this process (``LocalSystem`` on a SQLite file): release threads with
children and a threaded event (``examples/family.py``'s agent), triage threads waiting on a
build (``dormant demo``'s), writers with token usage, a stalled thread whose provider
refuses the key, and closed ones. ``dormant serve``'s app serves it on a free port; Chromium
(Debian's ``/usr/bin/chromium``, driven by Playwright) takes the list, a thread page, and a
thread page while its answer streams in (``drafter``, a slow simulated model).
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import uvicorn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dormant import Agent, LocalSystem  # noqa: E402
from dormant.demo import TRIAGE  # noqa: E402
from dormant.errors import ModelFatal  # noqa: E402
from dormant.http.serve import asgi_app  # noqa: E402
from dormant.http.ui.dashboard import Dashboard  # noqa: E402
from dormant.http.ui.setup import client_stream_url  # noqa: E402
from dormant.http.webhooks import WebhookReceiver  # noqa: E402
from dormant.messages import Item  # noqa: E402
from dormant.models import ScriptedModel, SimulatedModel  # noqa: E402
from dormant.models.base import Completion  # noqa: E402
from examples.family import AGENT as RELEASE  # noqa: E402
from tests.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402  (the tests' own flags)


def _refused(items: Sequence[Item]) -> Completion:
    raise ModelFatal("provider answered 401: invalid x-api-key (thread thr_billing_nightly)")


BILLING = Agent("billing", model=ScriptedModel(_refused, name="anthropic"))
WRITER = Agent("writer", model=SimulatedModel(completion_chars=420, chunk_chars=60))
SLOW_WRITER = Agent(
    "drafter", model=SimulatedModel(completion_chars=1600, chunk_chars=8, chunk_delay_s=0.04)
)


def build_fleet(system: LocalSystem) -> str:
    """Launch the fleet and let it settle; returns the thread to show on its own."""
    system.launch("release", "Is release 1.4 ready to ship?", thread_id="thr_release_1_4")
    system.run_until_idle()
    watch = next(
        c.call_id
        for c in system.store.load("thr_release_1_4").calls.values()
        if c.name == "watch_incidents"
    )
    system.send_event("thr_release_1_4", watch, "INC-7: billing latency up 20%", message_id="i7")
    for n, text in enumerate(["Is build 41 green?", "Is build 42 green?", "Check build 43"]):
        system.launch("triage", text, thread_id=f"thr_triage_{41 + n}")
    for n, topic in enumerate(["the Q3 changelog", "the on-call handbook", "the API guide"]):
        system.launch("writer", f"Draft {topic}.", thread_id=f"thr_writer_{n + 1}")
    system.run_until_idle(raise_on_failure=False)
    system.launch("billing", "Reconcile last night's invoices.", thread_id="thr_billing_nightly")
    system.run_until_idle(raise_on_failure=False)
    system.close_thread("thr_writer_3", reason="draft abandoned by the docs team")
    return "thr_release_1_4"


@contextmanager
def serving(system: LocalSystem, actions: bool) -> Iterator[str]:
    """``dormant serve``'s ASGI app with the dashboard, on a free loopback port."""
    dashboard = Dashboard(system, actions=actions, stream_url=client_stream_url(system))
    app = asgi_app(system, WebhookReceiver(system, []), dashboard)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the dashboard server did not start")
        time.sleep(0.05)  # waiting for a port to open, not for work
    try:
        yield f"http://127.0.0.1:{port}/dormant/ui/"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--width", type=int, default=1400)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        agents = [RELEASE, TRIAGE, BILLING, WRITER, SLOW_WRITER]
        with LocalSystem(agents, f"sqlite:///{tmp}/fleet.db") as system:
            shown = build_fleet(system)
            with serving(system, actions=True) as base, sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": args.width, "height": 760})
                page.goto(base)
                page.screenshot(path=str(args.out / "dashboard-threads.png"), full_page=True)
                page.goto(f"{base}thread?id={shown}")
                page.screenshot(path=str(args.out / "dashboard-thread.png"), full_page=True)
                live = system.launch(
                    "drafter", "Draft the 1.4 release notes.", thread_id="thr_notes"
                )
                page.goto(f"{base}thread?id={live}")
                page.wait_for_function(
                    "document.querySelector('.bubble.streaming .text').textContent.length > 420"
                )
                page.screenshot(path=str(args.out / "dashboard-live.png"))
                system.run_until_idle(raise_on_failure=False)
                browser.close()
    print(f"wrote dashboard-threads.png, dashboard-thread.png and dashboard-live.png in {args.out}")


if __name__ == "__main__":
    main()
