"""dormant ships ``py.typed``: a user's ``mypy --strict`` sees its real signatures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

USER_CODE = """\
from dormant import Client

client = Client.from_env()
thread_id: str = client.launch("triage", "Is build 42 green yet?")
wrong: str = client.launch("triage", 42)
"""

# Third-party modules are skipped so the check takes seconds; dormant itself is analysed
# (silently: only the user's file reports errors), as it would be in a user's project.
MYPY_INI = """\
[mypy]
strict = True
follow_imports = skip

[mypy-dormant,dormant.*]
follow_imports = silent
"""


def test_mypy_strict_on_user_code_catches_a_wrong_argument_to_launch(tmp_path: Path) -> None:
    (tmp_path / "user.py").write_text(USER_CODE)
    (tmp_path / "mypy.ini").write_text(MYPY_INI)
    mypy = [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", "cache"]
    checked = subprocess.run(
        [*mypy, "user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
    )
    report = checked.stdout + checked.stderr
    assert "py.typed" not in report, report  # without the marker: "missing ... py.typed marker"
    assert checked.returncode == 1, report
    errors = [line for line in report.splitlines() if ": error:" in line]
    assert errors == [
        'user.py:5: error: Argument 2 to "launch" of "Client" has incompatible type "int";'
        ' expected "str"  [arg-type]'
    ]
