"""Loads the Celery app with Django, as Celery's Django guide has it."""

from .celery import app as celery_app

__all__ = ["celery_app"]
