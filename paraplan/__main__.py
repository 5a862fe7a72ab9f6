"""``python -m paraplan`` runs the CLI."""

from paraplan.cli import _console_script

_console_script()
