"""docs/streaming.md's snippets run as they are: the ``LocalSystem`` one prints the history
and the resumed tail, the Flask one defines its view."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "streaming.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_local_system_snippet_prints_the_history_then_resumes() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_python_blocks()[0], str(DOC), "exec"), {})
    lines = out.getvalue().splitlines()
    assert [line.split("] ", 1)[1] for line in lines if line.startswith("[") and "] " in line] == [
        "item 1: user",
        "item 2: assistant",
        "status: closed",
    ]
    assert lines[-1] == "['item', 'status']"


def test_the_flask_snippet_defines_a_streaming_view() -> None:
    block = next(b for b in _python_blocks() if "from flask import" in b)
    namespace: dict[str, object] = {"__name__": "shop"}
    exec(compile(block, str(DOC), "exec"), namespace)
    app = namespace["app"]
    rules = {rule.rule for rule in app.url_map.iter_rules()}  # type: ignore[attr-defined]
    assert "/threads/<thread_id>/events" in rules
