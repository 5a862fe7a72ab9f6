"""Rich rendering of StepReports for the terminal (tables with units)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _fmt_s(x: float) -> str:
    if x >= 100:
        return f"{x:,.1f} s"
    if x >= 1:
        return f"{x:.3f} s"
    return f"{x * 1e3:.2f} ms"


def print_report(out: Console, report: dict[str, Any], title: str) -> None:
    """One plan: headline numbers, time breakdown, memory breakdown (or why infeasible)."""
    out.print(f"[bold]{title}[/]  plan: {report.get('plan_short', '')}")
    if not report["feasible"]:
        out.print("[bold red]infeasible[/]")
        for reason in report["reasons"]:
            out.print(f"  - {reason}")
        if report["memory_per_stage_gb"]:
            out.print("memory per stage (GiB): " + ", ".join(
                f"{x:.1f}" for x in report["memory_per_stage_gb"]))
        return
    head = Table(show_header=False, title_justify="left")
    head.add_column("metric")
    head.add_column("value", justify="right")
    head.add_row("step time", _fmt_s(report["step_time_s"]))
    head.add_row("tokens/s (cluster)", f"{report['tokens_per_s']:,.0f}")
    head.add_row("model TFLOP/s per GPU", f"{report['model_tflops_per_gpu']:.1f}")
    head.add_row("MFU / HFU", f"{report['mfu'] * 100:.1f}% / {report['hfu'] * 100:.1f}%")
    head.add_row("dp x micro-batches", f"{report.get('dp')} x {report.get('num_microbatches')}")
    head.add_row("peak memory (worst stage)",
                 f"{report['memory_gb']['peak']:.1f} of {report.get('memory_capacity_gb', 0):g}"
                 " GiB")
    out.print(head)
    times = Table(title="where time goes (critical stage)", title_justify="left")
    times.add_column("part")
    times.add_column("time", justify="right")
    times.add_column("share", justify="right")
    total = report["step_time_s"]
    tied = report.get("tied_embedding_s") or 0.0
    for key in ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble", "dp_comm",
                "optimizer"):
        val = report["time_s"][key]
        if val > 0 or key == "compute":
            times.add_row(key, _fmt_s(val), f"{100 * val / total:.1f}%")
        if key == "pp_comm" and tied > 0:  # part of pp_comm: the ends sum the embedding grads
            times.add_row("  of which embedding all-reduce", _fmt_s(tied),
                          f"{100 * tied / total:.1f}%")
    out.print(times)
    paces = {k: v for k, v in (report.get("slowest_part_pace") or {}).items() if v < 1.0}
    if paces:
        out.print("compute at the slowest part's pace (the step waits for it): " + ", ".join(
            f"{name} {100 * (1 / pace - 1):.1f}% slower than a median part"
            for name, pace in paces.items()))
    mem = Table(title="memory per GPU (worst stage, GiB)", title_justify="left")
    for key in ("weights", "grads", "optimizer", "activations", "other", "peak"):
        mem.add_column(key, justify="right")
    mem.add_row(*(f"{report['memory_gb'][k]:.2f}" for k in
                  ("weights", "grads", "optimizer", "activations", "other", "peak")))
    out.print(mem)
    if len(report["memory_per_stage_gb"]) > 1:
        out.print("memory per stage (GiB): " + ", ".join(
            f"{x:.1f}" for x in report["memory_per_stage_gb"]))
    saved = report.get("communication_savings")
    if saved:
        parts = []
        if saved["grad_compression"] != "none":
            parts.append(f"{saved['grad_compression']} sends "
                         f"{100 * saved['dp_bytes_fraction_per_sync']:.2g}% of the gradient "
                         "bytes per sync")
        if saved["dp_sync_interval"] > 1:
            parts.append(f"replicas sync every {saved['dp_sync_interval']} steps")
        if saved["pp_bytes_fraction"] < 1:
            parts.append(f"pipeline sends carry {100 * saved['pp_bytes_fraction']:.3g}% of "
                         "the activation bytes")
        out.print(f"relaxed synchronization: {'; '.join(parts) or 'custom ratio'}: data-"
                  f"parallel traffic {saved['dp_traffic_reduction']:,.3g}x lower; "
                  f"{saved['note']}")
