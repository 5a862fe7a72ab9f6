"""``python -m paraplan`` runs the CLI."""

from paraplan.cli import console_script

console_script()
