"""Which failures are a server of the deployment briefly out of reach, not a fault.

A restarting PostgreSQL or Redis, a pool with every connection busy: worth trying again
(the tool runner's hand-in) or answering 503 (the receivers). The drivers' modules are
imported only once something failed: ``LocalSystem`` on the memory store loads neither
SQLAlchemy nor redis (``import dormant`` stays light, tests/test_import_cost.py).
"""

from __future__ import annotations

from dormant.errors import DatabaseUnavailable, RedisUnavailable, Unavailable

__all__ = ["unreachable_server"]


def unreachable_server(error: BaseException) -> str | None:
    """The server ``error`` says is out of reach ("the database", "Redis", ...), or None."""
    if isinstance(error, DatabaseUnavailable):
        return "the database"
    if isinstance(error, RedisUnavailable):
        return "Redis"
    if isinstance(error, Unavailable):
        return "a server the deployment needs"
    import redis.exceptions
    import sqlalchemy.exc

    # TimeoutError: every pooled connection is busy (the pool's timeout); an overload.
    database = sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError
    if isinstance(error, database | sqlalchemy.exc.TimeoutError):
        return "the database"
    if isinstance(error, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return "Redis"
    return None
