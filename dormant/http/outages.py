"""Which failures of a request are an outage of the deployment, not the sender's fault.

A receiver whose database or Redis does not answer has done nothing: it answers 503 with
a JSON reason, so the sender (a CI system, GitHub) sees a temporary failure to retry, not a
server error. The reason names the server but not its address or the driver's message:
the sender is outside; the log line has the detail.
"""

from __future__ import annotations

import logging

from dormant.stores.outages import unreachable_server

__all__ = ["UNAVAILABLE_STATUS", "unavailable_reason"]

UNAVAILABLE_STATUS = 503
log = logging.getLogger("dormant.http")


def unavailable_reason(error: BaseException) -> str | None:
    """The reason to send for ``error`` if it is an outage (and log it), else None.

    The drivers' modules are imported only once something failed
    (``stores/outages.py``).
    """
    server = unreachable_server(error)
    if server is None:
        return None
    log.warning("a request found %s unavailable: %s: %s", server, type(error).__name__, error)
    return f"{server} is unavailable: try again later"
