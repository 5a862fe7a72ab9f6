"""The ``paraplan`` typer app: every command registered in the order ``--help`` lists them,
and the console-script entry point that turns bad input into one line and exit code 2."""

from __future__ import annotations

import os
import sys

import typer

from paraplan.cli import executor, export, fleet, profiles, search, simulate, validate
from paraplan.cli.common import RunFailed
from paraplan.specs import SpecError

app = typer.Typer(
    name="paraplan",
    help=(
        "How to split LLM training across GPUs, and how fast it will run.\n\n"
        "Examples:\n\n"
        "  paraplan profiles\n\n"
        "  paraplan describe --model llama3-70b\n\n"
        "  paraplan describe --cluster dgx-h100 --nodes 32 --format json\n\n"
        "  paraplan describe --model path/to/config.json\n\n"
        "  paraplan best --model llama3-70b --cluster dgx-h100 --nodes 32 --global-batch 1024 "
        "--seq-len 8192"
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

# (name, function) in the order ``paraplan --help`` lists them.
COMMANDS = (
    ("profiles", profiles.profiles),
    ("describe", profiles.describe),
    ("simulate", simulate.simulate),
    ("best", search.best),
    ("pareto", search.pareto),
    ("sweep", fleet.sweep_cmd),
    ("validate-dtfm", validate.validate_dtfm_cmd),
    ("validate-published", validate.validate_published_cmd),
    ("validate-recipes", validate.validate_recipes_cmd),
    ("run", executor.run_cmd),
    ("calibrate", executor.calibrate_cmd),
    ("validate-executor", executor.validate_executor_cmd),
    ("export", export.export_cmd),
    ("explain", simulate.explain_cmd),
)
for _name, _command in COMMANDS:
    app.command(_name)(_command)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: map bad input to exit 2 with one line, crashes to exit 1."""
    args = sys.argv[1:] if argv is None else argv
    try:
        result = app(args=args, prog_name="paraplan", standalone_mode=False)
        return int(result) if isinstance(result, int) else 0
    except SpecError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except RunFailed as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 3
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort:
        sys.stderr.write("aborted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - last line of defence: no traceback for users
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            # typer's (vendored click) usage errors: unknown option, bad value, missing arg.
            sys.stderr.write(f"error: {exc.format_message()}\n")
            return int(exc.exit_code or 2)
        if os.environ.get("PARAPLAN_DEBUG"):
            raise
        sys.stderr.write(f"internal error: {type(exc).__name__}: {exc} "
                         "(set PARAPLAN_DEBUG=1 for a traceback; please report it)\n")
        return 1


def console_script() -> None:  # pragma: no cover - thin wrapper
    sys.exit(main())
