"""``dormant serve``: callbacks, webhooks and health probes over uvicorn (``dormant[serve]``).

It fails like every command (``cli/errors.py``): a setting it cannot start with (no
``DORMANT_SECRET_KEY`` and, on SQLite, no key beside the file; a bad
``DORMANT_WEBHOOK_SECRETS``; uvicorn not installed) is one ``error:`` line and exit code 3,
before it listens; so is a port it cannot listen on
(``listen.py``). A ``--port`` out of range is a usage error (exit 2).
"""

from __future__ import annotations

import contextlib

import typer

from dormant.cli.options import port_option

__all__ = ["serve"]


def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = port_option(8000),
) -> None:
    """Serve callback URLs, webhooks (DORMANT_WEBHOOK_SECRETS), /healthz, /readyz and the
    thread dashboard at /dormant/ui/ (DORMANT_UI_TOKEN; without it, only on 127.0.0.1)."""
    from dormant.cli.connect import hosted_celery_app, verifying_settings
    from dormant.cli.errors import EXIT_UNAVAILABLE, say
    from dormant.cli.listen import listening_socket
    from dormant.client import Client
    from dormant.errors import ConfigurationError
    from dormant.http.serve import asgi_app
    from dormant.http.ui.setup import serve_dashboard
    from dormant.http.webhooks import WebhookReceiver, github_source

    try:
        import uvicorn
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise ConfigurationError(
            "dormant serve needs uvicorn: pip install 'dormant[serve]'"
        ) from None
    settings = verifying_settings()
    sources = [github_source(keys, name) for name, keys in settings.webhook_secrets]
    sock = listening_socket(host, port)
    # Under flask/manage.py, wakes go through the project's own Celery app and broker.
    with sock, Client.from_settings(settings, celery_app=hosted_celery_app()) as client:
        dashboard = serve_dashboard(client, host)
        app = asgi_app(client, WebhookReceiver(client, sources), dashboard)
        # No access log: webhook and callback URLs carry tokens, which must not land in logs.
        # Open streams (SSE) end only with their threads: a stop waits 5 s for them, no more.
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="info",
            lifespan="on",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
        server = uvicorn.Server(config)
        # uvicorn logs where it listens only for a socket it bound itself.
        shown = f"[{host}]" if ":" in host else host
        say(f"serving on http://{shown}:{sock.getsockname()[1]}/ (press CTRL+C to quit)")
        with contextlib.suppress(KeyboardInterrupt):  # CTRL+C ends it, as uvicorn.run does
            server.run(sockets=[sock])
    if not server.started:
        raise typer.Exit(EXIT_UNAVAILABLE)  # uvicorn logged why (a failed startup)
