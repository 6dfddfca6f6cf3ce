"""A project built as a user builds it: files from a doc's blocks, commands as subprocesses
in its directory, on a PostgreSQL database of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.databases import admin_engine, empty_database

__all__ = [
    "REDIS_URL",
    "ROOT",
    "Project",
    "database_exists",
    "doc_files",
    "postgres_database",
    "watched_broker",
]

ROOT = Path(__file__).resolve().parent.parent.parent
BIN = Path(sys.executable).parent
REDIS_URL = os.environ.get("DORMANT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

_BLOCK = re.compile(r"```python\n# (?P<path>[\w/.]+\.py)(?P<append> \(add at the end\))?\n")


@dataclass(frozen=True)
class DocFile:
    path: str
    text: str
    append: bool


def doc_files(doc: str) -> list[DocFile]:
    """The doc's Python blocks that name their file on their first line (``# proj/x.py``,
    or ``# proj/x.py (add at the end)``), in the doc's order."""
    source = (ROOT / "docs" / doc).read_text()
    found = []
    for match in _BLOCK.finditer(source):
        body = source[match.end() : source.index("```", match.end())]
        found.append(DocFile(match["path"], body, append=bool(match["append"])))
    return found


@dataclass(frozen=True)
class Project:
    cwd: Path
    env: dict[str, str]

    def write(self, files: list[DocFile]) -> None:
        for file in files:
            path = self.cwd / file.path
            path.parent.mkdir(parents=True, exist_ok=True)
            if file.append:
                assert path.exists(), f"the doc adds to {file.path}, which does not exist"
                path.write_text(path.read_text() + "\n" + file.text)
            else:
                path.write_text(file.text)

    def run(self, *argv: str, expect: int = 0) -> str:
        """``argv`` in the project's directory (the venv's commands first on PATH); its
        output, once it exited with ``expect``."""
        path = os.pathsep.join([str(BIN), os.environ.get("PATH", "")])
        done = subprocess.run(
            argv,
            cwd=self.cwd,
            env={**os.environ, **self.env, "PATH": path},
            capture_output=True,
            text=True,
            timeout=300,
        )
        output = done.stdout + done.stderr
        assert done.returncode == expect, f"{argv} exited {done.returncode}:\n{output}"
        return output


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(f"!!! PostgreSQL UNAVAILABLE, project tests NOT RUN: {reason}")


@contextmanager
def postgres_database(prefix: str) -> Iterator[str]:
    """A new, empty PostgreSQL database's name; dropped afterwards, with ``test_<name>``
    if a failed ``manage.py test`` left it behind."""
    with empty_database(prefix, _unavailable) as url:
        name = make_url(url).database
        assert name
        try:
            yield name
        finally:
            admin = admin_engine()
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "test_{name}" WITH (FORCE)'))
            admin.dispose()


def database_exists(name: str) -> bool:
    admin = admin_engine()
    try:
        with admin.connect() as conn:
            found = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name})
            return found.first() is not None
    finally:
        admin.dispose()


class BrokerWatch:
    """The shared Redis seen by a test whose launch must reach its own prefixed list."""

    def __init__(self, keys: redis.Redis, prefix: str, thread_id: str) -> None:
        self.keys, self.prefix, self.thread_id = keys, prefix, thread_id

    def queued(self, pattern: str) -> list[bytes]:
        """The broker lists matching ``pattern`` that hold a message for the thread."""
        return [
            key
            for key in self.keys.scan_iter(match=pattern, count=1000)
            if self.keys.type(key) == b"list"
            and any(self.thread_id.encode() in raw for raw in self.keys.lrange(key, 0, -1))
        ]

    def assert_queued_under_the_prefix_only(self) -> None:
        assert self.queued(f"{self.prefix}:dormant.interactive*")
        assert not self.queued("dormant.interactive*")


@contextmanager
def watched_broker(prefix: str, thread_id: str) -> Iterator[BrokerWatch]:
    """A ``BrokerWatch``; after it, the thread's messages and the prefix's keys are gone
    (a message sent unprefixed by mistake, too: the Redis is shared)."""
    keys = redis.Redis.from_url(REDIS_URL)
    watch = BrokerWatch(keys, prefix, thread_id)
    try:
        yield watch
    finally:
        for key in watch.queued("dormant.interactive*"):
            for raw in keys.lrange(key, 0, -1):
                if thread_id.encode() in raw:
                    keys.lrem(key, 1, raw)
        found = list(keys.scan_iter(match=f"{prefix}*", count=1000))
        if found:
            keys.delete(*found)
        keys.close()
