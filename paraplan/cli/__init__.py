"""The ``paraplan`` command line (typer + rich).

Every command takes ``--format table|json``; JSON goes to stdout and nothing else does (tables
and progress go to stdout only in table mode, errors always to stderr). Exit codes: 0 success,
2 bad input (one line naming the field, the value and what is allowed), 1 internal error.

Modules: ``app`` (the typer app and the entry point), ``common`` (output format, JSON, console),
``inputs`` (plans, training arguments and output paths as the user typed them), ``goodput``,
``report_view`` (a StepReport as tables), and one module per command group: ``profiles``
(profiles, describe), ``simulate`` (simulate, explain), ``search`` (best, pareto), ``export``,
``validate`` (validate-published, validate-dtfm), ``executor`` (run, calibrate,
validate-executor).
"""

from __future__ import annotations

from paraplan.cli.app import app, console_script, main

__all__ = ["app", "console_script", "main"]
