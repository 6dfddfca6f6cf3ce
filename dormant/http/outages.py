"""Which failures of a request are an outage of the deployment, not the sender's fault.

A receiver whose database or Redis does not answer has done nothing: it answers 503 with
a JSON reason, so the sender (a CI system, GitHub) sees a temporary failure to retry, not a
server error. The reason names the server but not its address or the driver's message:
the sender is outside; the log line has the detail.
"""

from __future__ import annotations

import logging

from dormant.errors import DatabaseUnavailable, RedisUnavailable, Unavailable

__all__ = ["UNAVAILABLE_STATUS", "unavailable_reason"]

UNAVAILABLE_STATUS = 503
log = logging.getLogger("dormant.http")


def unavailable_reason(error: BaseException) -> str | None:
    """The reason to send for ``error`` if it is an outage (and log it), else None.

    The drivers' modules are imported only here, once something failed: the receivers
    load neither SQLAlchemy nor redis for a ``LocalSystem`` on the memory store.
    """
    server = _unavailable_server(error)
    if server is None:
        return None
    log.warning("a request found %s unavailable: %s: %s", server, type(error).__name__, error)
    return f"{server} is unavailable: try again later"


def _unavailable_server(error: BaseException) -> str | None:
    if isinstance(error, DatabaseUnavailable):
        return "the database"
    if isinstance(error, RedisUnavailable):
        return "Redis"
    if isinstance(error, Unavailable):
        return "a server the receiver needs"
    import redis.exceptions
    import sqlalchemy.exc

    # TimeoutError: every pooled connection is busy (the pool's timeout); an overload.
    database = sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError
    if isinstance(error, database | sqlalchemy.exc.TimeoutError):
        return "the database"
    if isinstance(error, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return "Redis"
    return None
