"""Settings written once, in the host framework: Django's ``DATABASES``/``DORMANT`` and
Flask's ``app.config`` become dormant's ``Settings``, parsed as the variables are."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from celery import Celery

from dormant.contrib._settings import redis_url_of, settings_from
from dormant.contrib.django import database_url
from dormant.contrib.flask import settings_from_config
from dormant.errors import ConfigurationError
from dormant.stores.sql import SQLStore, upgrade


def test_a_django_postgresql_database_becomes_a_sqlalchemy_url() -> None:
    url = database_url(
        {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "shop",
            "USER": "app",
            "PASSWORD": "p@ss",
            "HOST": "db.internal",
            "PORT": "5433",
        }
    )
    assert url == "postgresql://app:p%40ss@db.internal:5433/shop"
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/db.sqlite3"}
    assert database_url(sqlite) == "sqlite:////srv/db.sqlite3"
    with pytest.raises(ConfigurationError, match="mysql"):
        database_url({"ENGINE": "django.db.backends.mysql", "NAME": "shop"})


def test_values_are_parsed_like_the_environment_and_win_over_the_hosts_defaults() -> None:
    settings = settings_from(
        {"secret_key": ["new", "old"], "LEASE_TTL_S": 60, "AGENTS": "shop.agents"},
        {"DATABASE_URL": "postgresql://db/shop", "LEASE_TTL_S": "30"},
        "settings.DORMANT",
    )
    assert settings.secret_keys == ("new", "old")
    assert settings.lease_ttl_s == 60.0
    assert settings.agents_module == "shop.agents"
    assert settings.database_url == "postgresql://db/shop"


def test_an_unknown_or_malformed_setting_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="'DATABSE_URL'"):
        settings_from({"DATABSE_URL": "x"}, {}, "settings.DORMANT")
    with pytest.raises(ConfigurationError, match="DORMANT_LEASE_TTL_S"):
        settings_from({"LEASE_TTL_S": "soon"}, {}, "settings.DORMANT")


def test_flask_config_supplies_the_database_and_the_celery_broker_supplies_redis() -> None:
    celery_app = Celery("shop", set_as_current=False, broker="redis://cache:6379/2")
    config = {
        "SQLALCHEMY_DATABASE_URI": "postgresql+psycopg://db/shop",
        "DORMANT_KEY_PREFIX": "shop",
        "DORMANT": {"SECRET_KEY": "s3cret"},
    }
    settings = settings_from_config(config, celery_app)
    assert settings.database_url == "postgresql+psycopg://db/shop"
    assert settings.broker_url == settings.redis_url == "redis://cache:6379/2"
    assert settings.key_prefix == "shop"
    assert settings.secret_keys == ("s3cret",)
    amqp = Celery("shop", set_as_current=False, broker="amqp://guest@rabbit//")
    assert settings_from_config(config, amqp).redis_url == "redis://127.0.0.1:6379/0"
    assert redis_url_of("amqp://guest@rabbit//") is None


def test_djangos_in_memory_test_database_is_shared_not_a_stray_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``manage.py test`` on SQLite names its database ``file:memorydb_default?mode=memory
    &cache=shared``: dormant opens that same in-memory database, never a file so named."""
    monkeypatch.chdir(tmp_path)
    name = "file:memorydb_default?mode=memory&cache=shared"
    url = database_url({"ENGINE": "django.db.backends.sqlite3", "NAME": name})
    django_side = sqlite3.connect(name, uri=True)  # Django's test connection keeps it alive
    try:
        upgrade(url)
        store = SQLStore(url)
        try:
            assert store.threads() == []
        finally:
            store.close()
        tables = {r[0] for r in django_side.execute("SELECT name FROM sqlite_master")}
        assert "threads" in tables, tables
    finally:
        django_side.close()
    assert list(tmp_path.iterdir()) == []
