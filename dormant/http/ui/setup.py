"""The dashboards each host builds: ``dormant serve``'s, guarded by its token."""

from __future__ import annotations

from dormant.base_client import BaseClient
from dormant.http.ui.dashboard import Dashboard, StreamUrl
from dormant.http.ui.guard import TokenGate

__all__ = ["client_stream_url", "serve_dashboard"]


def client_stream_url(client: BaseClient) -> StreamUrl | None:
    """The live view's URL maker: the client's signed stream URLs, where it has them."""
    make = getattr(client, "stream_url", None)
    if make is None:
        return None

    def url(thread_id: str) -> str | None:
        return str(make(thread_id, ttl_s=STREAM_TTL_S))

    return url


STREAM_TTL_S = 3600.0
"""A dashboard page's stream capability lives this long (a reload mints a fresh one)."""


def serve_dashboard(client: BaseClient) -> Dashboard:
    """``dormant serve``'s dashboard: ``DORMANT_UI_TOKEN`` and ``DORMANT_UI_ACTIONS``."""
    settings = client.settings
    return Dashboard(
        client,
        actions=settings.ui_actions,
        gate=TokenGate(settings.ui_token),
        stream_url=client_stream_url(client),
    )
