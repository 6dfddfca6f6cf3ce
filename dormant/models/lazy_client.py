"""An SDK client made on first use, shared by the provider models."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["LazyClient"]


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


class LazyClient(Generic[C]):
    """Makes the client on first use, so defining an agent needs no credentials; after
    ``close()`` the next use makes a fresh one from the model's own settings."""

    def __init__(self, factory: Callable[[], C], client: C | None = None) -> None:
        self._factory = factory
        self._client = client
        self._lock = threading.Lock()

    def get(self) -> C:
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            return self._client

    def close(self) -> None:
        """Close the client's connections, even one passed in."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
