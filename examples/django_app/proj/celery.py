"""The project's Celery app; ``celery -A proj worker`` runs its tasks and dormant's agents."""

import os

from celery import Celery

import dormant.contrib.django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
dormant.contrib.django.install(app)  # agents: settings.DORMANT["AGENTS"]
