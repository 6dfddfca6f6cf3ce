"""The Django app: in ``INSTALLED_APPS``, ``manage.py migrate`` also migrates dormant's schema.

dormant's tables are versioned by its own Alembic migrations (``dormant_alembic_version``),
so rather than copying them into Django migrations (two histories to keep in step), every
``migrate`` of the default database runs them to the newest: idempotent, and an upgraded
dormant's schema arrives with the next ``migrate``, exactly as ``dormant db upgrade`` would.
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate

__all__ = ["DormantConfig"]


class DormantConfig(AppConfig):  # type: ignore[misc]
    name = "dormant.contrib.django"
    label = "dormant"
    verbose_name = "dormant"
    default = True

    def ready(self) -> None:
        post_migrate.connect(_upgrade, sender=self, dispatch_uid="dormant.upgrade")


def _upgrade(using: str = "default", verbosity: int = 1, **_: Any) -> None:
    from dormant.contrib.django import settings
    from dormant.stores.sql.store import upgrade

    if using != "default":
        return
    current = settings()
    upgrade(current.database_url, table_prefix=current.table_prefix)
    if verbosity >= 1:
        print("  dormant: schema is at its newest migration")
