"""What the provider models share: a lazily made SDK client and the streamed-turn loop."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Mapping, MutableMapping
from contextlib import closing
from dataclasses import replace
from datetime import UTC, datetime
from typing import Generic, Protocol, TypeVar

from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.rate_limit import RateLimit, provider_limits

__all__ = ["LazyClient", "SDKModel", "TurnBuilder", "keep_rate_headers"]


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)
E = TypeVar("E")
E_contra = TypeVar("E_contra", contravariant=True)


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


class TurnBuilder(Protocol[E_contra]):
    """Accumulates one streamed turn: text goes live to ``on_chunk`` as it arrives."""

    def add(self, event: E_contra, on_chunk: ChunkSink) -> None: ...

    def completion(self) -> Completion: ...


class SDKModel(ABC, Generic[C, E]):
    """A ``Model`` on an official SDK: stream the provider's events into a turn, and
    return it only once the stream has completed (a broken stream raises instead)."""

    model: str
    base_url: str | None
    rate_limit: RateLimit | None
    """Admission's limit for this model (``DORMANT_RATE_LIMITS`` overrides it)."""

    def __init__(self, client: C | None, rate_limit: RateLimit | None = None) -> None:
        self._sdk = LazyClient(self._new_client, client)
        self.rate_limit = rate_limit

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, base_url={self.base_url!r})"

    @property
    def client(self) -> C:
        """The SDK client, made on first use so defining an agent needs no credentials."""
        return self._sdk.get()

    def close(self) -> None:
        """Close the SDK client's connections; a later completion opens a new client."""
        self._sdk.close()

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        turn = self._new_turn()
        headers: dict[str, str] = {}
        with closing(self._stream(request, headers)) as events:
            for event in events:
                turn.add(event, on_chunk)
        completion = turn.completion()
        limits = provider_limits(headers, datetime.now(UTC))
        return replace(completion, limits=limits) if limits else completion

    @abstractmethod
    def _new_client(self) -> C: ...

    @abstractmethod
    def _new_turn(self) -> TurnBuilder[E]: ...

    @abstractmethod
    def _stream(
        self, request: ModelRequest, headers: MutableMapping[str, str]
    ) -> Generator[E, None, None]:
        """The provider's events; the response's rate-limit headers go into ``headers``
        (``keep_rate_headers``) once the stream opens."""


def keep_rate_headers(source: Mapping[str, str], into: MutableMapping[str, str]) -> None:
    """Copy the rate-limit headers of a response (lowercased names) for admission."""
    for name, value in source.items():
        lowered = name.lower()
        if "ratelimit" in lowered or lowered.startswith("retry-after"):
            into[lowered] = value
