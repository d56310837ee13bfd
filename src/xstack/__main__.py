"""``python -m xstack`` runs the CLI."""

from xstack.cli.main import entry

entry()
