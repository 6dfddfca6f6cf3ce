"""``dormant callbacks``' development server: ``wsgiref``, keeping the request target.

``wsgiref`` hands the app only the decoded ``PATH_INFO``, in which an id's encoded ``/``
has become a separator; the handler adds the target as sent (``RAW_URI``, as gunicorn and
Werkzeug do), which the callback receiver reads first (``paths.sent_path``), and logs
each request without its query string, where the token is.
"""

from __future__ import annotations

from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from dormant.http.callbacks import WSGIApp

__all__ = ["RawPathHandler", "make_dev_server"]


class RawPathHandler(WSGIRequestHandler):
    """``wsgiref``'s handler, with the request target as sent in ``RAW_URI``."""

    def get_environ(self) -> dict[str, Any]:
        environ: dict[str, Any] = super().get_environ()
        environ["RAW_URI"] = self.path
        return environ

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """The request line without its query: a callback URL's token must not be logged."""
        self.log_message('"%s %s" %s', self.command, self.path.split("?", 1)[0], code)


def make_dev_server(host: str, port: int, app: WSGIApp) -> WSGIServer:
    """A single-threaded ``wsgiref`` server for ``app`` (development only)."""
    return make_server(host, port, app, handler_class=RawPathHandler)
