"""The screenshot of docs/tracing.md: one traced turn in Arize Phoenix, in headless Chromium.

    make phoenix-env && .venv/bin/python bench/trace_screenshot.py   # docs/tracing-phoenix.png

Starts Phoenix (``tests/.venv-phoenix``) on free ports with its data in a temporary
directory, runs a turn of a support agent (two tool round trips, scripted: no network) on a
``LocalSystem`` whose OpenTelemetry SDK exports over OTLP/HTTP to it, then opens the trace
in Phoenix's UI and saves what it shows.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PHOENIX = ROOT / "tests" / ".venv-phoenix" / "bin" / "phoenix"
CHROMIUM = os.environ.get("DORMANT_TEST_CHROMIUM", "/usr/bin/chromium")
OUT = ROOT / "docs" / "tracing-phoenix.png"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def _poll(what: str, found: Any, deadline_s: float = 180.0) -> Any:
    ends = time.monotonic() + deadline_s
    while time.monotonic() < ends:
        value = found()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def _turn(endpoint: str) -> str:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    resource = {"service.name": "support-agents", "openinference.project.name": "dormant"}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)

    from dormant import Agent, LocalSystem, tool
    from dormant.messages import Item, ToolResult
    from dormant.models import ScriptedModel, call, reply
    from dormant.models.base import Completion

    @tool
    def lookup_order(order_id: str) -> str:
        """The order's state."""
        return json.dumps({"order": order_id, "state": "delivered", "total": 42.5})

    @tool
    def refund(order_id: str, amount: float) -> str:
        """Refund part of an order."""
        return f"refunded {amount} on {order_id}"

    def support(items: Sequence[Item]) -> Completion:
        results = [i for i in items if isinstance(i, ToolResult)]
        if not results:
            return reply("Let me look at that order.", call("lookup_order", order_id="A-17"))
        if len(results) == 1:
            return reply(
                "It was delivered; refunding.", call("refund", order_id="A-17", amount=42.5)
            )
        return reply("Done: 42.50 is refunded to your card.")

    agent = Agent(
        "support",
        model=ScriptedModel(support, name="openai:gpt-4.1-mini"),
        tools=[lookup_order, refund],
    )
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalSystem([agent], f"sqlite:///{tmp}/t.db") as system,
    ):
        thread_id = system.launch("support", "My order A-17 arrived broken, refund please")
        system.run_until_idle(timeout_s=30)
    provider.shutdown()
    return thread_id


def main() -> None:
    if not PHOENIX.exists():
        raise SystemExit(f"no {PHOENIX}: run make phoenix-env")
    with tempfile.TemporaryDirectory() as workdir:
        port, grpc_port = _port(), _port()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env |= {
            "PHOENIX_WORKING_DIR": workdir,
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(port),
            "PHOENIX_GRPC_PORT": str(grpc_port),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        log = open(Path(workdir) / "phoenix.log", "wb")  # noqa: SIM115
        server = subprocess.Popen(
            [str(PHOENIX), "serve"], env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _poll("Phoenix", lambda: _get(f"{url}/v1/projects"))
            thread_id = _turn(f"{url}/v1/traces")
            spans = _poll(
                "the spans",
                lambda: (_get(f"{url}/v1/projects/dormant/spans?limit=100") or {}).get("data"),
            )
            trace_id = spans[0]["context"]["trace_id"]
            project = next(p for p in _get(f"{url}/v1/projects")["data"] if p["name"] == "dormant")
            _shoot(f"{url}/projects/{project['id']}/traces/{trace_id}")
            print(f"thread {thread_id}, trace {trace_id}: {OUT}")
        finally:
            server.terminate()
            server.wait(timeout=15)
            log.close()


def _shoot(page_url: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--no-first-run"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 820})
        page.goto(page_url)
        page.get_by_text("chat gpt-4.1-mini").first.click(timeout=60_000)  # its attributes
        page.wait_for_timeout(5000)  # the span's details render after their GraphQL answers
        page.screenshot(path=str(OUT))
        browser.close()


if __name__ == "__main__":
    main()
