"""The SQL store (``store.py``): SQLite and PostgreSQL, its schema, statements and retention.

``SQLStore`` and ``upgrade`` load on first use, so that importing one of this package's
modules (the schema, say) does not pay for the store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dormant.stores.sql.store import (
        MIGRATIONS_DIR,
        VERSION_TABLE,
        SQLStore,
        make_engine,
        upgrade,
    )

__all__ = ["MIGRATIONS_DIR", "VERSION_TABLE", "SQLStore", "make_engine", "upgrade"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from dormant.stores.sql import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
