"""``import dormant`` stays cheap: no provider SDK, Celery, HTTP client or CLI library.

Checked in a fresh interpreter, since this test process has long imported all of them.
What is checked is the set of modules loaded, not time (a busy machine makes time noise).
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "openai",
    "anthropic",
    "celery",
    "kombu",
    "httpx",
    "typer",
    "rich",
    "click",
    "opentelemetry",
)

PUBLIC_NAMES = (
    "from dormant import Agent, BaseClient, Client, DormantError, LocalSystem, Settings, "
    "Tool, ToolContext, tool\nfrom dormant.models import SimulatedModel, ScriptedModel"
)

_PROBE = """
import json, sys
{statement}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""

_PACKAGES = """
import json, sys
{statement}
tops = {{m.split(".")[0] for m in sys.modules}} - set(sys.stdlib_module_names)
tops = {{m for m in tops if not m.startswith("_")}} - {{"dormant"}}
print(json.dumps(sorted(tops)))
"""


def _last_json_line(program: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=120
    )
    found: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def _imported_heavy(statement: str) -> list[str]:
    return _last_json_line(_PROBE.format(statement=statement, heavy=HEAVY))


def _third_party(statement: str) -> list[str]:
    """The top-level packages outside the standard library (and dormant) ``statement`` loads."""
    return _last_json_line(_PACKAGES.format(statement=statement))


def test_import_dormant_loads_no_sdk_celery_httpx_or_cli_library() -> None:
    assert _imported_heavy("import dormant") == []


def test_import_dormant_alone_loads_nothing_outside_the_standard_library() -> None:
    assert _third_party("import dormant") == []


def test_the_public_names_still_import_from_the_package() -> None:
    assert _imported_heavy(PUBLIC_NAMES) == []


def test_the_public_names_load_pydantic_and_nothing_else() -> None:
    assert _third_party(PUBLIC_NAMES) == [
        "annotated_types",
        "pydantic",
        "pydantic_core",
        "typing_extensions",
        "typing_inspection",
    ]


def test_cli_help_loads_typer_and_rich_but_no_pydantic_database_or_celery() -> None:
    statement = (
        "import contextlib\nsys.argv = ['dormant', '--help']\nfrom dormant.cli import app\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(None): app()"
    )
    loaded = set(_third_party(statement))
    assert "typer" in loaded
    absent = {"pydantic", "sqlalchemy", "sqlmodel", "alembic", "celery", "kombu", "redis"}
    absent |= {"httpx", "openai", "anthropic", "psycopg"}
    assert loaded & absent == set()


def test_lazy_names_still_resolve_on_first_use() -> None:
    found = _imported_heavy(
        "from dormant.models import OpenAIModel, AnthropicModel\n"
        "from dormant.tools import http_tool, HttpToolError"
    )
    assert {"openai", "anthropic", "httpx"} <= set(found)


def test_an_unknown_name_is_an_attribute_error() -> None:
    import dormant

    try:
        dormant.NoSuchName  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as error:
        assert "NoSuchName" in str(error)
    else:
        raise AssertionError("dormant.NoSuchName resolved")
