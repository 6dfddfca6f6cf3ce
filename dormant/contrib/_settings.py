"""``Settings`` from a host framework's configuration: a dict named like the variables.

``{"DATABASE_URL": ..., "SECRET_KEY": ...}`` means what ``DORMANT_DATABASE_URL`` and
``DORMANT_SECRET_KEY`` mean (docs/celery.md lists them). Values are read through
``Settings.from_env`` so they are parsed and checked exactly as the variables are; the
process environment is not read, so the framework's settings are the one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.engine import make_url

from dormant.errors import ConfigurationError
from dormant.settings import ENV_NAMES, Settings

__all__ = ["redis_url_of", "settings_from"]

_NAMES = {var.removeprefix("DORMANT_"): var for var in ENV_NAMES.values()}


def settings_from(values: Mapping[str, Any], defaults: Mapping[str, str], where: str) -> Settings:
    """Settings from ``values`` (the names of docs/celery.md without ``DORMANT_``), falling
    back to ``defaults`` (same names) that the host's own settings imply."""
    env: dict[str, str] = {}
    for name, value in {**defaults, **values}.items():
        var = _NAMES.get(name.upper())
        if var is None:
            known = ", ".join(sorted(_NAMES))
            raise ConfigurationError(f"{where}: unknown dormant setting {name!r} (known: {known})")
        if value is None:
            continue
        if not isinstance(value, str) and isinstance(value, Iterable):
            value = ",".join(str(v) for v in value)  # SECRET_KEY as a list of keys
        env[var] = str(value)
    return Settings.from_env(env)


def redis_url_of(broker_url: object) -> str | None:
    """The broker URL, if it is a Redis one: dormant's Redis keys can live beside Celery's."""
    if not isinstance(broker_url, str) or not broker_url:
        return None
    try:
        scheme = make_url(broker_url.split(";")[0]).drivername
    except Exception:
        return None
    return broker_url if scheme in ("redis", "rediss") else None
