"""What every command shares: the output format option, JSON to stdout, the console, short
times, and the files a report writes (--plot, --trace)."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console

from paraplan.specs import SpecError
from paraplan.specs.safe_io import dumps_json


class RunFailed(Exception):
    """A real run (``paraplan run``, ``calibrate``, ``validate-executor``) started and failed:
    exit code 3, distinct from bad input (2) and an internal error (1)."""


class Format(StrEnum):
    table = "table"
    json = "json"


FormatOpt = Annotated[
    Format, typer.Option("--format", "-f", help="table (for people) or json (for programs).")
]


def emit_json(data: Any) -> None:
    """Write one JSON document to stdout (standard JSON only, see ``safe_io.dumps_json``)."""
    sys.stdout.write(dumps_json(data, indent=2, default=json_default) + "\n")


def json_default(value: Any) -> Any:
    """JSON for what ``json`` cannot write: pydantic models, numpy values, the rest as str."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float | int):
        return value
    return str(value)


def console() -> Console:
    return Console(soft_wrap=False, width=max(100, Console().width))


def fmt_time(x: float) -> str:
    """Seconds as a person reads them: 1,234.5 s, 12.345 s or 12.3 ms."""
    return f"{x:,.1f} s" if x >= 100 else f"{x:.3f} s" if x >= 1 else f"{x * 1e3:.1f} ms"


def wrote(path: str, fmt: Format) -> None:
    """Tell a person (not a program reading JSON) which file was written."""
    if fmt is not Format.json:
        sys.stderr.write(f"wrote {path}\n")


def write_report_outputs(report: dict[str, Any], fmt: Format, *, plot: str | None = None,
                          trace: str | None = None) -> None:
    """Write a StepReport's timeline + memory figure (--plot) and Chrome trace (--trace),
    atomically; both need a feasible plan."""
    for field, path in (("--plot", plot), ("--trace", trace)):
        if path is not None and (not report["feasible"] or "stage_forward_s" not in report):
            raise SpecError(f"{field} needs a feasible plan; this one is not: "
                            + "; ".join(report["reasons"]), field=field, value=path)
    if plot is not None:
        from paraplan.viz.timeline import save_figure, timeline_figure

        save_figure(timeline_figure(report), plot, field="--plot")
        wrote(plot, fmt)
    if trace is not None:
        from paraplan.viz.trace import write_chrome_trace

        write_chrome_trace(report, trace, field="--trace")
        wrote(trace, fmt)
