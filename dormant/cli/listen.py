"""Where ``dormant serve`` and ``dormant callbacks`` listen, and how failing to fails.

Both bind their port before serving anything, so a port in use (or not allowed) is one
``error:`` line naming the address, with exit code 3 (the deployment cannot serve the
command now), the same for both commands: not uvicorn's log lines, nor an "unexpected
OSError".
"""

from __future__ import annotations

import errno
import socket

from dormant.errors import ConfigurationError

__all__ = ["cannot_listen", "listening_socket"]

_REASONS = {
    errno.EADDRINUSE: "the port is in use by another process: stop it or choose another --port",
    errno.EACCES: "permission denied: ports below 1024 need privileges, choose another --port",
    errno.EADDRNOTAVAIL: "this machine has no such address: choose another --host",
}


def cannot_listen(host: str, port: int, error: OSError) -> ConfigurationError:
    """The error for a failed bind of ``host:port``, saying what to change."""
    reason = _REASONS.get(error.errno or 0) or error.strerror or str(error)
    return ConfigurationError(f"cannot listen on {host}:{port}: {reason}")


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` as uvicorn binds one (``SO_REUSEADDR``), for
    ``uvicorn.Server.run(sockets=...)``: a bind that fails raises ``cannot_listen``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise cannot_listen(host, port, error) from None
    sock.set_inheritable(True)
    return sock
