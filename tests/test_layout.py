"""The package's layout keeps its promises: the public import surface is exactly what users
import, no module imports another wing's private helpers, and no import circle returns."""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dormant"

PUBLIC = {
    "dormant": {
        "Agent", "Approval", "BaseClient", "Budget", "Client", "DormantError", "LocalSystem",
        "ReplayTools",
        "Settings", "Tool", "ToolContext", "tool",
    },
    "dormant.replay": {"ReplayTools"},
    "dormant.models": {
        "AnthropicModel", "ChunkSink", "Completion", "Model", "ModelRequest", "ModelSettings",
        "OpenAIModel", "RateLimit", "ScriptedModel", "SimulatedModel", "ToolChoice", "ToolSpec",
        "call", "reply",
    },
    "dormant.tools": {
        "HttpToolError", "McpToolError", "Tool", "ToolContext", "http_tool", "mcp_tools", "tool",
    },
    "dormant.worker": {
        "AgentSource", "CeleryDispatcher", "PRUNE_TASK", "QUEUES", "QUEUE_BACKGROUND",
        "QUEUE_INTERACTIVE", "QUEUE_TOOLS", "SLICE_TASK", "SWEEP_TASK", "SettingsSource",
        "TOOL_TASK", "bare_app", "broker_priority", "broker_transport_options", "celery_config",
        "client_dispatcher", "create_app", "install", "load_agents",
    },
    "dormant.tasks": {
        "CLAIM_RETRIES", "LazyRuntime", "Runtime", "claim_backoff_s", "outcome_text",
        "register_tasks",
    },
    "dormant.client": {
        "BaseClient", "Client", "OnCommit", "Waker", "new_message_id", "new_thread_id",
    },
    "dormant.local": {"LocalSystem", "open_store"},
    "dormant.approvals": {
        "Approval", "ApprovalContext", "ApprovalMethods", "PendingApproval", "build_decision",
        "find_request", "notify_requested", "pending",
    },
    "dormant.settings": {"ENV_NAMES", "Settings", "redact"},
    "dormant.callbacks": {"callback_app"},
    "dormant.webhooks": {
        "WebhookReceiver", "WebhookReply", "WebhookSource", "django_view", "flask_blueprint",
        "github_source", "webhook_url",
    },
    "dormant.serve": {"CALLBACKS_PREFIX", "WEBHOOKS_PREFIX", "asgi_app"},
    "dormant.check": {"Problem", "check_store"},
    "dormant.stores.sql": {"MIGRATIONS_DIR", "SQLStore", "VERSION_TABLE", "make_engine", "upgrade"},
    "dormant.stores.memory": {"MemoryStore"},
    "dormant.contrib.django": {
        "close_clients",
        "database_url",
        "dormant_client",
        "install",
        "settings",
        "stream_response",
    },
    "dormant.contrib.flask": {"Dormant", "settings_from_config"},
    "dormant.contrib.dashboard": {"django_view", "flask_blueprint"},
    "dormant.contrib.sqlalchemy": {"bind", "session_on_commit"},
    "dormant.demo": {"run_demo"},
    "dormant.cli": {"app"},
    "dormant.streams": {
        "CLOSED_N", "LiveEntry", "LiveLog", "StreamChunk", "StreamDispatched", "StreamEvent",
        "StreamEventAdapter", "StreamItem", "StreamRetry", "StreamStatus", "format_id",
        "parse_id",
    },
    "dormant.http.stream": {
        "HEARTBEAT_S", "SSE_HEADERS", "SSEResponse", "THREADS_PREFIX", "serve_stream",
        "sse_message", "sse_response", "verify_stream_token",
    },
}  # fmt: skip
"""Every module path the README, docs and examples import from, with its exact ``__all__``."""


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_the_public_import_surface_is_exactly_what_users_import(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert set(module.__all__) == PUBLIC[module_name]
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{module_name}.{name}"


def test_the_console_script_task_names_and_migrations_stay_where_they_were() -> None:
    from dormant.stores.sql import MIGRATIONS_DIR
    from dormant.worker import PRUNE_TASK, SLICE_TASK, SWEEP_TASK, TOOL_TASK

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"dormant": "dormant.cli:app"}
    assert (SLICE_TASK, TOOL_TASK, SWEEP_TASK, PRUNE_TASK) == (
        "dormant.slice",
        "dormant.tool",
        "dormant.sweep",
        "dormant.prune",
    )
    assert MIGRATIONS_DIR == PACKAGE / "stores" / "migrations"
    versions = sorted(p.name for p in (MIGRATIONS_DIR / "versions").glob("0*.py"))
    assert versions[:3] == [
        "0001_initial.py",
        "0002_retention_indexes.py",
        "0003_outbox_claims.py",
    ]


def _modules() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imports(path: Path, module: str) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import in the file, nested
    ones included, except those under ``if TYPE_CHECKING:`` (never run)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.extend((node.module, alias.name) for alias in node.names)
    return [(target, name) for target, name in found if target.split(".")[0] == "dormant"]


def _wing(module: str) -> str:
    """A module's wing: its folder (``dormant.runtime``, ``dormant.stores.sql``...)."""
    return module.rpartition(".")[0]


def test_no_module_imports_a_private_name_of_another_wing() -> None:
    modules = _modules()
    offences = [
        f"{module} takes {name} from {target}"
        for module, path in modules.items()
        for target, name in _imports(path, module)
        if name and name.startswith("_") and not name.startswith("__")
        and _wing(target) != _wing(module)
    ]  # fmt: skip
    assert offences == []


def test_no_import_circle_between_modules() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for target, name in _imports(path, module):
            submodule = f"{target}.{name}"
            targets.add(submodule if submodule in modules else target)
        # a package's face hands on its modules' names: its arrows are not the layout's
        graph[module] = targets - {module} if path.name != "__init__.py" else set()
    circles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                circles.append(stack[stack.index(target) :])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert circles == []
