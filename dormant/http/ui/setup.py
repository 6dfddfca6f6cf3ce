"""The dashboards each host builds: ``dormant serve``'s, guarded by its token."""

from __future__ import annotations

from urllib.parse import urlsplit

from dormant.base_client import BaseClient
from dormant.http.ui.dashboard import Dashboard, StreamUrl
from dormant.http.ui.guard import TokenGate

__all__ = ["client_stream_url", "serve_dashboard"]


def client_stream_url(client: BaseClient) -> StreamUrl:
    """The live view's URL maker for ``dormant serve``: the client's signed stream URL,
    without its scheme and host, since the page is served by the same server (the callback
    base URL may name a public address the operator's browser does not use)."""

    def url(thread_id: str) -> str | None:
        parts = urlsplit(client.stream_url(thread_id, ttl_s=STREAM_TTL_S))
        return f"{parts.path}?{parts.query}" if parts.query else parts.path

    return url


STREAM_TTL_S = 3600.0
"""A dashboard page's stream capability lives this long (a reload mints a fresh one)."""


def serve_dashboard(client: BaseClient, bind_host: str) -> Dashboard:
    """``dormant serve``'s dashboard: ``DORMANT_UI_TOKEN`` and ``DORMANT_UI_ACTIONS``;
    without a token it opens only when ``bind_host`` (``--host``) is a loopback address."""
    settings = client.settings
    return Dashboard(
        client,
        actions=settings.ui_actions,
        gate=TokenGate(settings.ui_token, bind_host),
        stream_url=client_stream_url(client),
    )
