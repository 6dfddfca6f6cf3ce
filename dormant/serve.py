"""The public path of ``dormant serve``'s ASGI app: ``dormant.serve.asgi_app(client, receiver)``.

The app lives in ``dormant/http/serve.py``.
"""

from dormant.http.serve import CALLBACKS_PREFIX, WEBHOOKS_PREFIX, asgi_app

__all__ = ["CALLBACKS_PREFIX", "WEBHOOKS_PREFIX", "asgi_app"]
