"""The request path as the sender wrote it: ids in callback and webhook URLs may hold ``/``
or ``%``, which the URL carries encoded (``team%2Fa%25b``).

A server decodes the path once (WSGI's ``PATH_INFO``, a framework's route arguments):
splitting that at ``/`` cuts such an id in two, and decoding it again changes it. So the
receivers read the raw request target where the server keeps it (gunicorn's and
Werkzeug's ``RAW_URI``, uWSGI's ``REQUEST_URI``, ``dormant serve`` and ``dormant
callbacks``), split it, and decode each segment exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

__all__ = ["sent_path", "sent_tail"]


def sent_path(environ: Mapping[str, Any]) -> str:
    """A WSGI request's path as sent, still percent-encoded.

    Without a raw request target, ``PATH_INFO`` is re-encoded, which is exact except for a
    ``/`` inside an id (the server has already made it a separator).
    """
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return str(raw).split("?", 1)[0]
    path = str(environ.get("PATH_INFO", ""))
    try:
        return quote(path.encode("latin-1"), safe="/")  # PEP 3333: bytes as latin-1
    except UnicodeEncodeError:
        return quote(path, safe="/")


def sent_tail(path: str, segments: int) -> str:
    """The last ``segments`` segments of an encoded path (what follows a mount point)."""
    return "/".join(path.rstrip("/").split("/")[-segments:])
