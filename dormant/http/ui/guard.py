"""Who may see the dashboard, and proof that a form was posted from it (CSRF).

Sessions: with a UI token (``DORMANT_UI_TOKEN``) a browser logs in once and gets a cookie
``<expiry>.<HMAC(token, expiry)>``: the token itself never sits in a cookie, and changing the
token ends every session. Scripts may send ``Authorization: Bearer <token>`` instead.

CSRF: a random cookie, and in each form its HMAC under the deployment's secret (the signed
double-submit pattern): a page on another origin can neither read the cookie nor forge the
HMAC. A POST whose ``Origin`` names another host is refused as well.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = [
    "CSRF_COOKIE",
    "SESSION_COOKIE",
    "SESSION_TTL_S",
    "Csrf",
    "TokenGate",
    "is_loopback",
]

SESSION_COOKIE = "dormant_ui"
CSRF_COOKIE = "dormant_csrf"
SESSION_TTL_S = 12 * 3600.0


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _mac(key: str, message: str) -> str:
    return hmac.new(key.encode(), message.encode(), hashlib.sha256).hexdigest()


class TokenGate:
    """The ``dormant serve`` dashboard's gate: the UI token, or a purely local set-up.

    With no token, only a server bound to a loopback address (``bind_host``, the ``--host``
    it was started with) lets in peers that are on loopback and came through no proxy (no
    ``Forwarded``/``X-Forwarded-For`` header): the dashboard is never open on a public bind,
    nor behind a proxy, without a token. The bind decides, not the address a connection
    arrived on: on ``0.0.0.0`` a request relayed to 127.0.0.1 (``ssh -L``, ``kubectl
    port-forward``, a sidecar) may come from anywhere.
    """

    def __init__(self, token: str, bind_host: str | None = None) -> None:
        self.token = token
        self.bind_host = bind_host

    def allows(
        self, cookies: Mapping[str, str], headers: Mapping[str, str], client_host: str | None
    ) -> bool:
        if not self.token:
            proxied = "forwarded" in headers or "x-forwarded-for" in headers
            return is_loopback(self.bind_host) and is_loopback(client_host) and not proxied
        bearer = headers.get("authorization", "")
        if bearer.startswith("Bearer ") and hmac.compare_digest(bearer[7:], self.token):
            return True
        return self.session_valid(cookies.get(SESSION_COOKIE, ""))

    def login(self, token: str) -> str | None:
        """A session cookie value for the right token, else None."""
        if not self.token or not hmac.compare_digest(token, self.token):
            return None
        expiry = str(int(time.time() + SESSION_TTL_S))
        return f"{expiry}.{_mac(self.token, 'session:' + expiry)}"

    def session_valid(self, value: str) -> bool:
        expiry, _, mac = value.partition(".")
        if not expiry.isdigit() or int(expiry) < time.time():
            return False
        return hmac.compare_digest(mac, _mac(self.token, "session:" + expiry))


class Csrf:
    """Signed double-submit tokens under ``secret``."""

    def __init__(self, secret: str) -> None:
        self.secret = secret

    @staticmethod
    def new_cookie() -> str:
        return secrets.token_hex(16)

    def token(self, cookie: str) -> str:
        return _mac(self.secret, "csrf:" + cookie)

    def valid(self, cookie: str, posted: str, headers: Mapping[str, str]) -> bool:
        origin = headers.get("origin")
        if origin and origin != "null" and urlsplit(origin).netloc != headers.get("host"):
            return False
        return bool(cookie) and hmac.compare_digest(posted, self.token(cookie))
