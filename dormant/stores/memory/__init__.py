"""The in-memory store (``store.py``): the whole ``Store`` contract in one process.

``MemoryStore`` loads on first use, as ``SQLStore`` does in ``dormant.stores.sql``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dormant.stores.memory.store import MemoryStore

__all__ = ["MemoryStore"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from dormant.stores.memory import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
