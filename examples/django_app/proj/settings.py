"""Settings of the example project. Each value is written once: dormant reads the database
from DATABASES, the broker and Redis from CELERY_BROKER_URL, the rest from DORMANT."""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
INSTALLED_APPS = ["dormant.contrib.django", "shop"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "proj.urls"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("SHOP_DATABASE", "django_app"),
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    }
}

CELERY_BROKER_URL = os.environ.get("SHOP_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": os.environ.get("SHOP_BROKER_PREFIX", "")}
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

DORMANT = {
    "AGENTS": "shop.agents",
    "SECRET_KEY": os.environ.get("SHOP_DORMANT_SECRET", "dev-only-not-secret"),
    "KEY_PREFIX": os.environ.get("SHOP_DORMANT_PREFIX", "dormant"),
    "SWEEP_INTERVAL_S": 2,
}
