"""Alembic's entry point for dormant's shipped migrations.

Run through ``dormant.stores.sql.upgrade()``, which hands over an open connection in
``config.attributes["connection"]``; with none, an engine is built from ``sqlalchemy.url``.
Only dormant's own tables are compared, so an application may share the database. The
``table_prefix`` option (``Settings.table_prefix``) names the tables and the version table.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection, text

from dormant.stores.sql.store import VERSION_TABLE, make_engine
from dormant.stores.sql.tables import schema

# Any constant works, as long as it is the same in every process that migrates.
_MIGRATION_LOCK_KEY = 0x646F726D616E74  # "dormant"


def _options() -> dict[str, Any]:
    prefix = context.config.get_main_option("table_prefix") or ""
    metadata = schema(prefix).metadata

    def include_name(name: str | None, type_: str, _parents: dict[str, Any]) -> bool:
        """Autogenerate looks at this prefix's tables only, never an application's."""
        return type_ != "table" or name in metadata.tables

    return {
        "target_metadata": metadata,
        "version_table": context.config.get_main_option("version_table") or prefix + VERSION_TABLE,
        "include_name": include_name,
        "render_as_batch": True,  # SQLite alters tables by copying them
        "compare_type": True,
    }


def _run(connection: Connection) -> None:
    context.configure(connection=connection, **_options())
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Two workers starting at once must not both create the tables.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
            )
        context.run_migrations()


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(context.config.get_main_option("sqlalchemy.url") or "")
    try:
        with engine.begin() as connection:
            _run(connection)
    finally:
        engine.dispose()


def run_offline() -> None:
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        literal_binds=True,
        **_options(),
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
