"""How a command prints Rich renderables (tables, trees, timelines) on stdout."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["print_rich"]

PIPED_WIDTH = 100_000
"""Rich's width when stdout is not a terminal and ``COLUMNS`` is unset: a record a line, as
``grep`` and scripts read it, never wrapped at Rich's default of 80 columns."""


def print_rich(renderable: Any) -> None:
    """Print ``renderable`` as wide as the terminal, or unwrapped when piped."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=PIPED_WIDTH)
    console.print(renderable)
