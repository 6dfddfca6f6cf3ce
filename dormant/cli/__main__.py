"""``python -m dormant.cli``: the command line."""

from dormant.cli.app import app

app()
