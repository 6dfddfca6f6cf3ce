"""The schema's migrations: Alembic's configuration built in code, and ``upgrade``.

Alembic (with mako) is imported only when a migration runs: a worker never migrates.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.engine import URL

from dormant.stores.sql.engine import SQLITE_BEGIN, make_engine
from dormant.stores.sql.versions import VERSION_TABLE, refuse_unknown

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = ["MIGRATIONS_DIR", "alembic_config", "migrate", "upgrade"]

MIGRATIONS_DIR = Path(__file__).parent.parent / "migrations"


def alembic_config(url: URL, table_prefix: str) -> Config:
    """Alembic's configuration, built in code: the package ships no ``alembic.ini``. The
    migrations read ``table_prefix`` to name every table, index and constraint. Alembic
    (with mako) is imported here, not with the store: a worker never migrates."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    config.set_main_option(
        "sqlalchemy.url", url.render_as_string(hide_password=False).replace("%", "%%")
    )
    config.set_main_option("version_table", table_prefix + VERSION_TABLE)
    config.set_main_option("table_prefix", table_prefix)
    return config


def migrate(engine: Engine, table_prefix: str = "") -> str | None:
    """Migrate to the newest revision; the revision found first (None: no schema yet)."""
    from alembic import command

    config = alembic_config(engine.url, table_prefix)
    # On SQLite the migration takes the write lock before it reads the version table: two
    # processes opening a new file at once then run one after the other (the second finds
    # the tables made), as PostgreSQL's advisory lock in env.py makes them there.
    with engine.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"}).begin() as conn:
        found = refuse_unknown(conn, table_prefix)  # Alembic: "Can't locate revision '0011'"
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    return found


def upgrade(database_url: str, *, table_prefix: str = "") -> str | None:
    """Bring the database's schema to the newest shipped migration (``dormant db upgrade``);
    ``table_prefix`` names the tables (``Settings.table_prefix``). Returns the revision it
    found, None where there was no schema."""
    engine = make_engine(database_url)
    try:
        return migrate(engine, table_prefix)
    finally:
        engine.dispose()
