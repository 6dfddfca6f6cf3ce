"""The ``dormant`` command: the Typer app (``app.py``) and its command groups.

The console script and ``python -m dormant`` run ``dormant.cli:app``.
"""

from dormant.cli.app import app

__all__ = ["app"]
