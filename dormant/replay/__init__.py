"""Forks, replays and their diffs as callers use them (``Client``, ``LocalSystem``, the
``dormant`` command); the fork itself is ``runtime/forks.py``. See docs/forks.md."""

from dormant.replay.tools import ReplayTools

__all__ = ["ReplayTools"]
