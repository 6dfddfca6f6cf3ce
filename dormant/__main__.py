"""``python -m dormant``: the command line."""

from dormant.cli import app

app()
