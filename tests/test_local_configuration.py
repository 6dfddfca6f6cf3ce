"""LocalSystem as a newcomer meets it: which database it writes, and how its callback URLs
are signed so that they outlive the process that minted them."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from dormant import Agent, LocalSystem, ToolContext, tool
from dormant.messages import AssistantTurn, Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion
from dormant.settings import Settings
from dormant.stores.base import ThreadStatus

callbacks: dict[str, str] = {}


@tool(deferred=True)
def run_build(target: str, ctx: ToolContext) -> None:
    """Start a CI build; CI posts the result to the callback URL."""
    callbacks[target] = ctx.callback_url


def script(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText):
        return reply("building", call("run_build", target=last.text))
    if isinstance(last, ToolResult):
        return reply(f"build: {last.content}")
    return reply("ok")


AGENT = Agent("triage", model=ScriptedModel(script), tools=[run_build])


@pytest.fixture(autouse=True)
def no_dormant_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test starts from a clean environment, in its own working directory."""
    for name in ("DORMANT_SECRET_KEY", "DORMANT_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    callbacks.clear()


def last_text(system: LocalSystem, thread_id: str) -> str:
    last = system.history(thread_id)[-1]
    assert isinstance(last, AssistantTurn)
    return last.text


def start_build(url: str, target: str) -> str:
    """A first process: the agent starts a build and goes idle; returns the thread id."""
    with LocalSystem([AGENT], url) as system:
        thread_id = system.launch("triage", target)
        system.run_until_idle()
        assert system.thread(thread_id).status is ThreadStatus.WAITING
    return thread_id


def test_a_callback_url_minted_before_a_restart_is_accepted_after_it_on_sqlite(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/agents.db"
    thread_id = start_build(url, "main")
    with LocalSystem([AGENT], url) as system:  # a new process, no key configured
        system.deliver_callback(callbacks["main"], "green")
        system.run_until_idle()
        assert last_text(system, thread_id) == "build: green"


def test_the_generated_signing_key_is_kept_beside_the_database_readable_by_its_owner_only(
    tmp_path: Path,
) -> None:
    start_build(f"sqlite:///{tmp_path}/agents.db", "main")
    key_file = tmp_path / "agents.db.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(key_file.read_text().strip()) == 64
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_a_callback_url_survives_a_restart_with_the_key_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DORMANT_SECRET_KEY", "the-deployment-key")
    url = f"sqlite:///{tmp_path}/agents.db"
    thread_id = start_build(url, "main")
    with LocalSystem([AGENT], url) as system:
        system.deliver_callback(callbacks["main"], "green")
        system.run_until_idle()
        assert last_text(system, thread_id) == "build: green"
    assert not (tmp_path / "agents.db.key").exists()  # the configured key is the only one
    assert "the-deployment-key" not in callbacks["main"]


def test_the_database_url_of_the_settings_given_is_the_one_written(tmp_path: Path) -> None:
    wanted = tmp_path / "chosen.db"
    with LocalSystem([AGENT], settings=Settings(database_url=f"sqlite:///{wanted}")) as system:
        system.launch("triage", "main")
        system.run_until_idle()
    assert wanted.exists()
    assert not (tmp_path / "dormant.db").exists()


def test_the_database_url_comes_from_the_environment_unless_an_argument_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DORMANT_DATABASE_URL", f"sqlite:///{tmp_path}/from-env.db")
    with LocalSystem([AGENT]) as system:
        system.launch("triage", "main")
        system.run_until_idle()
    assert (tmp_path / "from-env.db").exists()
    with LocalSystem([AGENT], f"sqlite:///{tmp_path}/argument.db") as system:
        system.launch("triage", "main")
        system.run_until_idle()
    assert (tmp_path / "argument.db").exists()
    assert not (tmp_path / "dormant.db").exists()


@pytest.mark.parametrize("command", ["callbacks", "serve"])
def test_dormant_callbacks_accepts_the_callback_urls_a_local_system_minted_on_sqlite(
    tmp_path: Path, command: str
) -> None:
    """With no ``DORMANT_SECRET_KEY``, ``dormant callbacks`` (port 8765, where the default
    callback URLs point) and ``dormant serve`` verify with the key kept beside the SQLite
    file, as ``LocalSystem`` does: the URL a tool handed to CI is answered, not refused
    with 403 (``callbacks``) or a refusal to start (``serve``)."""
    import os
    import socket
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from tests.harness import poll

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    thread_id = start_build("sqlite:///dormant.db", "main")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DORMANT_")}
    down = f"redis://127.0.0.1:{port}/0"  # no broker: the message is saved, the sweeper wakes it
    env |= {"DORMANT_BROKER_URL": down, "DORMANT_REDIS_URL": down}
    dormant = Path(sys.executable).with_name("dormant")
    server = subprocess.Popen(
        [str(dormant), command, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def listening() -> bool:
        assert server.poll() is None, server.communicate()[1]
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    try:
        poll(listening, timeout_s=60)
        url = callbacks["main"].replace("127.0.0.1:8765", f"127.0.0.1:{port}")
        request = urllib.request.Request(url, data=b"green", method="POST")
        request.add_header("Content-Type", "text/plain")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                status = answer.status
        except urllib.error.HTTPError as refused:
            status, body = refused.code, refused.read()
            raise AssertionError(f"{status}: {body!r}") from None
    finally:
        server.terminate()
        server.communicate(timeout=30)
    assert status in (200, 202)
    with LocalSystem([AGENT], "sqlite:///dormant.db") as system:
        system.run_until_idle()
        assert last_text(system, thread_id) == "build: green"
