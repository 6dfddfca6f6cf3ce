"""``import dormant`` stays cheap: no provider SDK, Celery, HTTP client or CLI library.

Checked in a fresh interpreter, since this test process has long imported all of them.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("openai", "anthropic", "celery", "kombu", "httpx", "typer", "rich", "click")

_PROBE = """
import json, sys
{statement}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _imported_heavy(statement: str) -> list[str]:
    probe = _PROBE.format(statement=statement, heavy=HEAVY)
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    found: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def test_import_dormant_loads_no_sdk_celery_httpx_or_cli_library() -> None:
    assert _imported_heavy("import dormant") == []


def test_the_public_names_still_import_from_the_package() -> None:
    statement = (
        "from dormant import Agent, BaseClient, Client, DormantError, LocalSystem, Settings, "
        "Tool, ToolContext, tool\nfrom dormant.models import SimulatedModel, ScriptedModel"
    )
    assert _imported_heavy(statement) == []


def test_lazy_names_still_resolve_on_first_use() -> None:
    found = _imported_heavy(
        "from dormant.models import OpenAIModel, AnthropicModel\n"
        "from dormant.tools import http_tool, HttpToolError"
    )
    assert {"openai", "anthropic", "httpx"} <= set(found)
