"""``paraplan sweep``: a grid of searches (models x clusters x node counts x batches x
sequences x trainers x precisions) run serially or on Ray, resumable, written as a table."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from paraplan.cli.common import Format, FormatOpt, emit_json


def sweep_cmd(
    grid: Annotated[str, typer.Option("--grid", help="Grid file (YAML): models, clusters with "
                                      "node counts, global_batches, seq_lens, trainers, "
                                      "precisions, searcher, top, tokens_to_train.")],
    out: Annotated[str, typer.Option("--out", help="Results table: .parquet (needs the fleet "
                                     "extra) or .csv; a CSV is always written beside it.")],
    resume: Annotated[bool, typer.Option("--resume", help="Finish an interrupted sweep: run "
                                         "only the jobs its parts folder does not hold.")]
    = False,
    backend: Annotated[str, typer.Option("--backend", help="auto (Ray when installed), "
                                         "serial or ray.")] = "auto",
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Join an existing "
                                                    "Ray cluster: auto or HOST:PORT (default: "
                                                    "start Ray on this machine).")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="Ray workers started here "
                                                "(default: this machine's cores).")] = None,
    plot: Annotated[str | None, typer.Option("--plot", help="Write two figures: PATH (cost "
                                             "against time to train, with the Pareto front) "
                                             "and PATH's stem + '-scaling' (best tokens/s per "
                                             "GPU against GPU count); .png, .svg or .pdf.")]
    = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Run one `best` search per grid job and write every job's top plans as one table
    (inputs, plan, step time, tokens/s, MFU, memory, $/hour, $ per million tokens, time to
    train). Finished jobs are kept as they finish; --resume continues a killed sweep.

    Example: paraplan sweep --grid grid.yaml --out results.parquet
    """
    from paraplan.fleet import COLUMNS, INT_COLUMNS, ResultStore, expand, load_grid, run_sweep
    from paraplan.fleet.runner import check_options

    jobs = expand(load_grid(grid))
    check_options(backend, ray_address, workers)  # before anything is written
    figures = None if plot is None else _plot_paths(plot, out)
    store = ResultStore(out, jobs, resume=resume)
    err = Console(stderr=True)
    if fmt is Format.json:
        summary = run_sweep(jobs, store, backend=backend, ray_address=ray_address,
                            workers=workers)
    else:
        columns = (TextColumn("jobs"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn())
        with Progress(*columns, console=err, transient=False) as bar:
            task = bar.add_task("sweep", total=len(jobs), rate="")
            seen: dict[str, float] = {}

            def progress(done: int, total: int) -> None:
                now = bar.get_time()
                seen.setdefault("t0", now)
                seen.setdefault("d0", done)
                dt = now - seen["t0"]
                rate = (done - seen["d0"]) / dt if dt > 0 else 0.0
                bar.update(task, completed=done, total=total, rate=f"{rate:.2f} jobs/s")

            summary = run_sweep(jobs, store, backend=backend, ray_address=ray_address,
                                workers=workers, progress=progress)
    frame = store.table(COLUMNS, INT_COLUMNS)
    written = store.write_frame(frame)
    if figures is not None:
        written += _plots(frame, figures)
    if fmt is Format.json:
        emit_json({**asdict(summary), "outputs": [str(p) for p in written]})
        return
    err.print(f"{summary.jobs} jobs ({summary.skipped} already done, {summary.failed} failed) "
              f"on {summary.backend} with {summary.workers} worker(s): {summary.ran} run in "
              f"{summary.wall_s:.1f} s ({summary.jobs_per_s:.2f} jobs/s)")
    for path in written:
        err.print(f"wrote {path}")


def _plot_paths(plot: str, out: str) -> tuple[Path, Path]:
    """The two figure paths of ``--plot``, checked before the sweep runs."""
    from paraplan.export.files import check_target
    from paraplan.specs import SpecError
    from paraplan.viz.timeline import check_figure_path

    first = check_figure_path(plot, "--plot")
    second = first.with_name(f"{first.stem}-scaling{first.suffix}")
    tables = {Path(out).resolve(), Path(out).with_suffix(".csv").resolve()}
    for path in (first, second):
        check_target(path, "--plot")
        if path.resolve() in tables:
            raise SpecError(f"--plot {str(path)!r} would overwrite the results table",
                            field="--plot", value=plot)
    return first, second


def _plots(frame: Any, figures: tuple[Path, Path]) -> list[Path]:
    """The sweep's two figures (``viz.sweep``) of the table just written, at ``figures``."""
    from paraplan.viz.sweep import cost_time_figure, scaling_figure
    from paraplan.viz.timeline import save_figure

    first, second = figures
    return [save_figure(cost_time_figure(frame), first),
            save_figure(scaling_figure(frame), second)]

