"""Celery and kombu, beside ``dormant.worker`` and ``dormant.tasks``: the dispatcher, the
producer-only app of a client, the Redis transport, Flower's task names and the worker and
beat processes. Only these modules, ``worker.py`` and ``tasks.py`` import Celery.
"""
