"""The invariant checker's public path: ``dormant.check.check_store(store, grace_s=...)``.

The checker lives in ``dormant/ops/check.py``.
"""

from dormant.ops.check import Problem, check_store

__all__ = ["Problem", "check_store"]
