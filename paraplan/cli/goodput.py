"""Goodput under failures for ``simulate`` and ``best``: the options, the section of a report
(paraplan/simulator/goodput.py does the arithmetic) and its table."""

from __future__ import annotations

import math
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from paraplan.specs import SpecError

MtbfOpt = Annotated[float | None, typer.Option(
    "--mtbf-hours", help="Per-GPU mean time between failures (hours): adds goodput and the "
    "optimal checkpoint interval (Young/Daly).")]
CkptWriteOpt = Annotated[float | None, typer.Option(
    "--checkpoint-write-s", help="Seconds training pauses per checkpoint.")]
StorageOpt = Annotated[float | None, typer.Option(
    "--storage-GBps", help="Aggregate checkpoint storage bandwidth (GB/s): derives the write "
    "(and, without --restart-s, the reload) time from the checkpoint size.")]
RestartOpt = Annotated[float | None, typer.Option(
    "--restart-s", help="Seconds from an interruption back to training.")]
PreemptOpt = Annotated[float, typer.Option(
    "--preemption-rate", help="Spot preemptions per GPU-hour.")]


def goodput_section(report: dict[str, Any], model: Any, mtbf_hours: float | None,
                    write_s: float | None, storage_gbps: float | None, restart_s: float | None,
                    preempt: float) -> dict[str, Any] | None:
    """The goodput section of a feasible report (None without --mtbf-hours)."""
    from paraplan.simulator.goodput import checkpoint_bytes, goodput

    given = {"--checkpoint-write-s": write_s, "--storage-GBps": storage_gbps,
             "--restart-s": restart_s}
    if mtbf_hours is None:
        extra = [k for k, v in given.items() if v is not None]
        if extra or preempt:
            raise SpecError(f"{(extra or ['--preemption-rate'])[0]} needs --mtbf-hours (goodput "
                            "under failures)", field="--mtbf-hours", value=None)
        return None
    if storage_gbps is not None and not (math.isfinite(storage_gbps)
                                         and 1e-3 <= storage_gbps <= 1e7):
        raise SpecError(f"--storage-GBps={storage_gbps!r} must be a number from 0.001 to 1e+07",
                        field="--storage-GBps", value=storage_gbps, allowed="0.001..1e7")
    flags = {"--mtbf-hours": mtbf_hours, **given, "--preemption-rate": preempt}
    for flag, value in flags.items():
        if value is not None and not math.isfinite(value):
            raise SpecError(f"{flag}={value!r} must be a finite number", field=flag,
                            value=value)
    size = checkpoint_bytes(model.num_params)
    # Seconds to write (or reload) the whole checkpoint at the storage bandwidth.
    transfer_s = None if storage_gbps is None else size / (storage_gbps * 1e9)
    if write_s is None:
        if transfer_s is None:
            raise SpecError("--mtbf-hours needs --checkpoint-write-s or --storage-GBps (how "
                            "long a checkpoint takes)", field="--checkpoint-write-s",
                            value=None)
        write_s = transfer_s
    if restart_s is None:
        if transfer_s is None:
            raise SpecError("--mtbf-hours needs --restart-s, or --storage-GBps to take the "
                            "checkpoint reload time", field="--restart-s", value=None)
        restart_s = transfer_s
    if not report.get("feasible"):
        return None
    gp = goodput(int(report["num_gpus"]), mtbf_h=mtbf_hours, checkpoint_write_s=write_s,
                 restart_s=restart_s, preempt_per_h=preempt).to_dict()
    gp["checkpoint_bytes"] = size
    gp["effective_tokens_per_s"] = report["tokens_per_s"] * gp["goodput"]
    gp["note"] = ("interruptions are independent and exponential (Daly 2006); the checkpoint "
                  "holds 16-bit weights plus fp32 master weights and Adam moments")
    return gp


def print_goodput(out: Console, gp: dict[str, Any]) -> None:
    """The goodput section as a two-column table."""
    table = Table(title="goodput under failures (Young/Daly)", title_justify="left",
                  show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("job mean time between interruptions",
                  f"{gp['job_mtbf_h']:.2f} h ({gp['interruptions_per_day']:.1f} per day)")
    table.add_row("checkpoint write / restart",
                  f"{gp['checkpoint_write_s']:.1f} s / {gp['restart_s']:.1f} s "
                  f"({gp['checkpoint_bytes'] / 1e12:.2f} TB)")
    table.add_row("optimal checkpoint interval (Daly)",
                  f"{gp['optimal_interval_s'] / 60:.1f} min of work "
                  f"(Young: {gp['young_interval_s'] / 60:.1f} min)")
    table.add_row("goodput", f"{100 * gp['goodput']:.1f}%")
    table.add_row("effective tokens/s", f"{gp['effective_tokens_per_s']:,.0f}")
    out.print(table)
