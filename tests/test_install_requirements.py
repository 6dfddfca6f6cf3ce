"""What ``pip install dormant`` installs is enough to run it.

The development environment holds every extra and every test tool, so a module dormant
imports but does not require is there by accident: kombu's Redis transport imports
``packaging``, which only ``kombu[redis]`` requires, and ``pip install dormant`` without
it failed at the first wake (``dormant serve``, a worker, ``Client.from_settings``) with
``No module named 'packaging'``, while every test here passed.

Each case imports, in a fresh interpreter, what one way of running dormant imports, with
every distribution outside the closure of dormant's declared requirements (with that
case's extras, read from the installed metadata the way pip resolves them) hidden, as on a
machine where only ``pip install dormant`` ran: an import that then fails is a missing
requirement. A module imported only if present (``try: import django``) is no failure.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata

import pytest
from packaging.requirements import Requirement

_IMPORT_WITHOUT = """
import importlib, importlib.abc, json, sys

hidden = set(json.loads(sys.argv[1]))

class Uninstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed)", name=name)
        return None

sys.meta_path.insert(0, Uninstalled())
for name in sys.argv[2:]:
    importlib.import_module(name)
"""

CASES = {
    "base": (
        (),
        [
            "dormant",
            "dormant.cli.app",
            "dormant.worker",
            "dormant.tasks",
            "dormant.client",
            "dormant.local",
            "dormant.celery.broker",
            "dormant.celery.dispatch",
            "kombu.transport.redis",  # the broker dormant.celery.broker wraps
            "kombu.transport.pyamqp",
            "dormant.stores.sql.store",
            "dormant.stores.sql.migrate",
            "alembic.command",  # `dormant db upgrade` imports it when it migrates
            "dormant.stores.redis",
            "dormant.models.openai_model",
            "dormant.models.anthropic_model",
            "dormant.http.asgi",
        ],
    ),
    "serve": (("serve",), ["dormant.http.serve", "uvicorn", "uvicorn.protocols.http.h11_impl"]),
    "mcp": (
        ("mcp",),
        ["dormant.tools.mcp", "mcp", "mcp_types", "mcp.client.streamable_http", "mcp.client.stdio"],
    ),
    "otel": (
        ("otel",),
        ["dormant.tracing.spans", "dormant.tracing.metrics", "dormant.tracing.carrier"],
    ),
    "flower": (("flower",), ["flower.command", "dormant.worker"]),
}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(name: str, extras: tuple[str, ...]) -> set[str]:
    """The distributions pip installs for ``name[extras]``: its requirements whose markers
    hold for those extras, and theirs, recursively."""
    seen: set[str] = set()
    todo = [(name, extras)]
    while todo:
        dist_name, wanted = todo.pop()
        key = _canonical(dist_name)
        if (key in seen and not wanted) or key in {"pip", "setuptools"}:
            continue
        seen.add(key)
        for text in metadata.requires(dist_name) or []:
            req = Requirement(text)
            environments = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in environments):
                todo.append((req.name, tuple(req.extras)))
    return seen


def _hidden_modules(required: set[str]) -> list[str]:
    """Top-level modules that only distributions outside ``required`` ship."""
    shipped = metadata.packages_distributions()
    return sorted(
        top
        for top, dists in shipped.items()
        if top != "dormant" and not any(_canonical(d) in required for d in dists)
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_dormant_imports_comes_with_its_declared_requirements(case: str) -> None:
    extras, modules = CASES[case]
    hidden = _hidden_modules(_closure("dormant", extras))
    assert "pytest" in hidden  # a test tool, never a requirement: the hiding is in force
    ran = subprocess.run(
        [sys.executable, "-c", _IMPORT_WITHOUT, json.dumps(hidden), *modules],
        capture_output=True,
        text=True,
    )
    error = ran.stderr.strip().splitlines()[-1:] if ran.returncode else []
    assert error == [], f"`pip install dormant{list(extras) or ''}` lacks it: {ran.stderr}"
