"""``python manage.py dormant ...``: every ``dormant`` command, configured by ``settings.py``.

The plain ``dormant`` command reads ``DORMANT_*`` variables, which a Django project does not
set: there it would look at another database (and ``dormant db upgrade`` would create it).
Here the settings are ``dormant.contrib.django.settings()``, the ones the project's web
and worker processes use. The arguments go to the ``dormant`` command untouched, so
``python manage.py dormant --help`` is its help.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

__all__ = ["Command"]


class Command(BaseCommand):  # type: ignore[misc]
    help = "dormant's command line, configured by settings.DORMANT (try: dormant --help)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER, help="a dormant command")

    def run_from_argv(self, argv: list[str]) -> None:
        """Django's own option parsing would take ``--help`` and ``--json``: skip it."""
        from django.db import connections

        script = os.path.basename(argv[0])
        prog_name = f"{'python ' if script.endswith('.py') else ''}{script} {argv[1]}"
        try:
            code = _run(_without_django_options(argv[2:]), prog_name)
        finally:
            connections.close_all()
        if code:
            sys.exit(code)

    def handle(self, *args: str, **options: Any) -> None:
        """``call_command("dormant", "threads")``: a failure is a ``CommandError``."""
        code = _run(list(args), "manage.py dormant")
        if code:
            raise CommandError(f"dormant {' '.join(args)} exited {code}", returncode=code)


_DJANGO_OPTIONS = ("--settings", "--pythonpath")
"""Options ``manage.py`` itself applied before it ran this command (Django's
``ManagementUtility`` reads them anywhere on the line); not ``dormant``'s."""


def _without_django_options(args: list[str]) -> list[str]:
    """``args`` without ``--settings X``/``--settings=X`` (and ``--pythonpath``)."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _DJANGO_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{option}=" for option in _DJANGO_OPTIONS)):
            kept.append(arg)
    return kept


def _run(args: list[str], prog_name: str) -> int:
    from dormant.cli.app import run_hosted
    from dormant.contrib.django import installed_app, settings

    celery_app = installed_app()  # the project's (proj/celery.py): its broker options
    return run_hosted(
        args, prog_name=prog_name, settings=lambda: settings(celery_app), celery_app=celery_app
    )
