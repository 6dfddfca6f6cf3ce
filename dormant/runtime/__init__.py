"""The runtime: the slice (``slice.py``) and its parts, written against narrow protocols.

``history.py`` holds the pure rules, ``calls.py``, ``children.py`` and ``compaction.py`` the
steps a slice takes, ``failures.py`` and ``quarantine.py`` what it does when it fails, and
``sweeper.py`` re-drives what a crash left behind. No store, Celery or SDK is imported here.
"""
