"""The thread dashboard: server-rendered pages over a client's store (``/dormant/ui/``).

``Dashboard`` answers framework-neutral requests; ``dormant serve`` (``asgi.py``), Django and
Flask (``dormant.contrib.dashboard``) adapt it.
"""

from dormant.http.ui.dashboard import Dashboard, UIRequest, UIResponse

__all__ = ["Dashboard", "UIRequest", "UIResponse"]
