"""``paraplan best`` (the fastest plans that fit, ranked, optionally exported for a trainer) and
``paraplan pareto`` (throughput vs memory headroom vs cost across cluster sizes)."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from paraplan.cli import goodput
from paraplan.cli.common import (
    Format,
    FormatOpt,
    console,
    emit_json,
    fmt_time,
    json_default,
    write_report_outputs,
)
from paraplan.cli.export import write_export
from paraplan.cli.inputs import (
    MoeDispatcherOpt,
    MoeDispatcherSmsOpt,
    MoeHostSyncOpt,
    MoeImbalanceOpt,
    MoeOverlapOpt,
    MomentsDtypeOpt,
    TrainerOpt,
    check_output_paths,
    read_trainer,
    read_training,
)
from paraplan.specs import SpecError, load_cluster, load_model
from paraplan.specs.trainer import trainer_training


class Searcher(StrEnum):
    auto = "auto"
    exhaustive = "exhaustive"
    ilp = "ilp"
    dp = "dp"
    evolutionary = "evolutionary"


class ExportFormat(StrEnum):
    json = "json"
    megatron = "megatron"
    torchtitan = "torchtitan"
    deepspeed = "deepspeed"
    nanotron = "nanotron"


class _LazyProgress:
    """A rich progress bar on stderr that appears only once a search has run for a second."""

    def __init__(self, label: str, enabled: bool) -> None:
        import time

        self._clock = time.perf_counter
        self._start = self._clock()
        self._label = label
        self._enabled = enabled
        self._bar = None
        self._task = None

    def __call__(self, done: int, total: int) -> None:
        if not self._enabled:
            return
        if self._bar is None:
            if self._clock() - self._start < 1.0:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._bar = Progress("[progress.description]{task.description}", BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self._label, total=total)
        self._bar.update(self._task, completed=done, total=total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def best(
    model: Annotated[str, typer.Option("--model", "-m", help="Preset, YAML or HF config.json.")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Preset or cluster YAML.")],
    global_batch: Annotated[int, typer.Option("--global-batch", "-b", help="Sequences per step.")],
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", help="Tokens per sequence.")],
    nodes: Annotated[int | None, typer.Option("--nodes", "-n", min=1, max=1_000_000,
                                              help="Number of nodes.")] = None,
    top: Annotated[int, typer.Option("--top", "-k", min=1, max=1000,
                                     help="How many plans to show.")] = 10,
    searcher: Annotated[Searcher, typer.Option(
        help="auto: exhaustive on one GPU type, ilp on a mixed cluster.")] = Searcher.auto,
    fix: Annotated[str | None, typer.Option(
        help="Pin parts of the plan, e.g. tp=8,pp=4 or rc=full,zero=1.")] = None,
    explain: Annotated[bool, typer.Option(
        "--explain", help="Why #1 beats #2, and the most common rejection reasons.")] = False,
    precision: Annotated[str, typer.Option(help="bf16, fp16, fp8 or fp32.")] = "bf16",
    no_flash: Annotated[bool, typer.Option("--no-flash-attention",
                                           help="Materialise s x s attention scores.")] = False,
    export: Annotated[ExportFormat | None, typer.Option(
        help="Write the best plan for a trainer, or as a plan JSON (needs --out).")] = None,
    out: Annotated[str | None, typer.Option("--out", "-o", help="File for --export.")] = None,
    seed: Annotated[int, typer.Option(min=0, max=2**32 - 1,
                                      help="Seed of the evolutionary searcher.")] = 0,
    plot: Annotated[str | None, typer.Option(
        "--plot", help="Write the best plan's pipeline timeline and memory per stage to this "
        "PNG/SVG/PDF.")] = None,
    mtbf_hours: goodput.MtbfOpt = None,
    checkpoint_write_s: goodput.CkptWriteOpt = None,
    storage_gbps: goodput.StorageOpt = None,
    restart_s: goodput.RestartOpt = None,
    preemption_rate: goodput.PreemptOpt = 0.0,
    relaxed: Annotated[bool, typer.Option(
        "--relaxed", help="Also search DiLoCo (H=10, 100), PowerSGD, 8/4-bit gradients and "
        "8/4-bit pipeline activations; bytes only, convergence not modelled.")] = False,
    trainer: TrainerOpt = None,
    moe_dispatcher: MoeDispatcherOpt = None,
    moe_a2a_overlap: MoeOverlapOpt = None,
    moe_imbalance: MoeImbalanceOpt = None,
    moe_host_sync_ms: MoeHostSyncOpt = None,
    moe_dispatcher_sms: MoeDispatcherSmsOpt = None,
    moments_dtype: MomentsDtypeOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Find the fastest plans that fit: a ranked table with step time, MFU, memory per GPU and
    where the time goes. Only plans the trainer (default megatron-core; with --export X, X's
    trainer) can run, priced as it runs them.

    Example: paraplan best --model llama3-70b --cluster dgx-h100 --nodes 32
    --global-batch 1024 --seq-len 8192 --top 5
    """
    from paraplan.search import search as run_search

    if export is not None and out is None:
        raise SpecError("--export needs --out PATH", field="--out", value=None)
    if out is not None and export is None:
        raise SpecError("--out needs --export FORMAT", field="--export", value=None,
                        allowed=[e.value for e in ExportFormat])
    check_output_paths(plot=plot)
    if out is not None:
        from paraplan.export.files import check_target

        check_target(out, "--out")  # before the search, not after it
    spec_model = load_model(model)
    spec_cluster = load_cluster(cluster, nodes=nodes)
    training = read_training(global_batch, seq_len, precision, flash_attention=not no_flash,
                             moe_dispatcher=moe_dispatcher, moe_a2a_overlap=moe_a2a_overlap,
                             moe_imbalance=moe_imbalance, moments_dtype=moments_dtype,
                             moe_host_sync_ms=moe_host_sync_ms,
                             moe_dispatcher_sms=moe_dispatcher_sms)
    spec_trainer = read_trainer(trainer, export.value if export is not None else None)
    if relaxed:
        from paraplan.search.relaxed import relaxed_search

        if not spec_trainer.can.relaxed_sync:
            raise SpecError(f"--relaxed searches DiLoCo and compression, which {spec_trainer.label}"
                            " cannot run; add --trainer generic", field="--trainer",
                            value=spec_trainer.name)
        err = Console(stderr=True)
        result = relaxed_search(spec_model, spec_cluster, training, searcher=searcher.value,
                                top=top, fix=fix, seed=seed, trainer=spec_trainer,
                                progress=(lambda m: err.print(f"[dim]{m}[/]"))
                                if fmt is not Format.json else None)
    else:
        bar = _LazyProgress(f"searching ({searcher.value})", enabled=sys.stderr.isatty())
        try:
            result = run_search(spec_model, spec_cluster, training, searcher=searcher.value,
                                top=top, fix=fix, progress=bar, seed=seed,
                                trainer=spec_trainer)
        finally:
            bar.close()
    data = result.to_dict()
    if explain:
        data["explain"] = _explain(data)
    gp = goodput.goodput_section(data["plans"][0] if data["plans"] else {}, spec_model, mtbf_hours,
                                 checkpoint_write_s, storage_gbps, restart_s, preemption_rate)
    if gp is not None:
        data["goodput"] = gp
    if plot is not None and data["plans"]:
        write_report_outputs(data["plans"][0], fmt, plot=plot)
    if export is not None and out is not None:
        _export_best(result, data, spec_model, spec_cluster,
                     trainer_training(spec_trainer, training), export.value, out,
                     quiet=fmt is Format.json)
    if fmt is Format.json:
        emit_json(data)
        return
    _print_best(console(), data, spec_model.name, spec_cluster, spec_trainer.label)
    if relaxed:
        _print_relaxed(console(), data["relaxed"])
    if gp is not None:
        goodput.print_goodput(console(), gp)


def _print_relaxed(out: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title="best plan per relaxed-synchronization setting", title_justify="left")
    for col, just in (("setting", "left"), ("best plan", "left"), ("step", "right"),
                      ("vs dense", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        if r["best_step_time_s"] is None:
            table.add_row(r["label"], "no plan fits", "-", "-")
            continue
        table.add_row(r["label"], r["best_plan"] or "", fmt_time(r["best_step_time_s"]),
                      "-" if r["speedup_vs_dense"] is None else f"{r['speedup_vs_dense']:.2f}x")
    out.print(table)


def _export_best(result: Any, data: dict[str, Any], model: Any, cluster: Any, training: Any,
                 fmt: str, out: str, *, quiet: bool) -> None:
    """Write the best feasible plan of a search as ``fmt`` (see ``paraplan export``); the plan
    JSON keeps the whole search result under ``search``."""
    from paraplan.export import export_context
    from paraplan.specs.plan import parse_plan

    best = next((r for r in result.reports if r.feasible), None)
    if best is None:
        raise SpecError("--export: the search found no feasible plan to export",
                        field="--export", value=fmt)
    from paraplan.search.moe_runs import run_training

    # The MoE dispatcher and all-to-all overlap the plan was ranked under are part of it.
    ctx = export_context(model, run_training(training, best), parse_plan(best.plan),
                         cluster=cluster)
    search = json.loads(json.dumps(data, default=json_default))
    write_export(fmt, ctx, out, report=best.to_dict(), search=search, quiet=quiet)


def _run_suffix(rep: dict[str, Any]) -> str:
    """The MoE run setting a plan was ranked under, for the table (nothing for alltoall
    without overlap, the trainers' plain setting, and for dense models)."""
    if "moe_dispatcher" not in rep:
        return ""
    from paraplan.search.moe_runs import run_label

    return "".join(f" {w}" for w in run_label(rep).split(" + ") if w != "alltoall")


def _explain(data: dict[str, Any]) -> dict[str, Any]:
    """Breakdown diff of the two best plans, and the top rejection reasons."""
    from paraplan.simulator.step import STEP_PARTS

    plans = data["plans"]
    out: dict[str, Any] = {"top_rejections": dict(list(data.get("rejected", {}).items())[:5])}
    if len(plans) >= 2:
        a, b = plans[0], plans[1]
        diff = {k: b["time_s"][k] - a["time_s"][k] for k in STEP_PARTS}
        mem = {k: b["memory_gb"][k] - a["memory_gb"][k] for k in a["memory_gb"]}
        out["first_vs_second"] = {
            "first": a.get("plan_short"), "second": b.get("plan_short"),
            "step_time_gap_s": b["step_time_s"] - a["step_time_s"],
            "time_s_second_minus_first": diff,
            "memory_gb_second_minus_first": mem,
        }
    return out


def _print_best(out: Console, data: dict[str, Any], model_name: str, cluster: Any,
                trainer: str) -> None:
    plans = data["plans"]
    out.print(f"[bold]{model_name}[/] on {cluster.num_gpus}x {'+'.join(cluster.gpu_types)} "
              f"with {trainer}: "
              f"{data['searcher']} search evaluated {data['plans_evaluated']:,} plans in "
              f"{data['search_time_s']:.2f} s"
              + (f" ({data['feasible_plans']:,} fit in memory)" if "feasible_plans" in data
                 else ""))
    from paraplan.simulator.step import STEP_PARTS

    table = Table(title_justify="left")
    for col, just in (("#", "right"), ("plan", "left"), ("step", "right"), ("MFU", "right"),
                      ("tokens/s", "right"), ("mem/GPU GiB", "right"),
                      ("where time goes", "left")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for i, rep in enumerate(plans, 1):
        total = rep["step_time_s"]
        parts = sorted(((rep["time_s"][k], k) for k in STEP_PARTS), reverse=True)
        where = " ".join(f"{k.replace('_comm', '')} {100 * v / total:.0f}%"
                         for v, k in parts[:3] if v > 0)
        table.add_row(str(i), rep.get("plan_short", "") + _run_suffix(rep), fmt_time(total),
                      f"{100 * rep['mfu']:.1f}%", f"{rep['tokens_per_s']:,.0f}",
                      f"{rep['memory_gb']['peak']:.1f} / {rep.get('memory_capacity_gb', 0):g}",
                      where)
    out.print(table)
    base = data.get("baseline_step_time_s")
    if base and plans and base > plans[0]["step_time_s"] * (1 + 1e-9):
        out.print(f"baseline (rank-order placement): {fmt_time(base)}; the best plan is "
                  f"{base / plans[0]['step_time_s']:.2f}x faster")
    for note in data.get("notes", []):
        out.print(f"[dim]note: {note}[/]")
    if "explain" in data:
        ex = data["explain"]
        cmp_ = ex.get("first_vs_second")
        if cmp_:
            out.print(f"\n[bold]why #1 beats #2[/] ({cmp_['second']} is "
                      f"{fmt_time(cmp_['step_time_gap_s'])} slower):")
            for k, v in sorted(cmp_["time_s_second_minus_first"].items(),
                               key=lambda kv: -abs(kv[1])):
                if abs(v) > 1e-9:
                    out.print(f"  {k:<10} {'+' if v > 0 else '-'}{fmt_time(abs(v))}")
            dm = cmp_["memory_gb_second_minus_first"]["peak"]
            out.print(f"  memory     {dm:+.1f} GiB per GPU (peak)")
        if ex["top_rejections"]:
            out.print(f"\n[bold]rejected[/] ({data.get('considered', 0):,} plans considered):")
            for reason, n in ex["top_rejections"].items():
                out.print(f"  {n:>12,}  {reason}")


def pareto(
    model: Annotated[str, typer.Option("--model", "-m", help="Preset, YAML or HF config.json.")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Preset or cluster YAML.")],
    global_batch: Annotated[int, typer.Option("--global-batch", "-b", help="Sequences per step.")],
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", help="Tokens per sequence.")],
    nodes: Annotated[str | None, typer.Option(
        "--nodes", "-n", help="Node counts to compare, e.g. 4,8,16,32.")] = None,
    fix: Annotated[str | None, typer.Option(help="Pin parts of the plan, e.g. tp=8.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="At most this many points.")] = 25,
    precision: Annotated[str, typer.Option(help="bf16, fp16, fp8 or fp32.")] = "bf16",
    plot: Annotated[str | None, typer.Option(
        "--plot", help="Write the front to this PNG/SVG/PDF.")] = None,
    trainer: TrainerOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Pareto front of throughput vs memory headroom vs $ per hour across cluster sizes.

    Example: paraplan pareto --model llama3-70b --cluster dgx-h100 --nodes 4,8,16,32
    --global-batch 512 --seq-len 8192 --plot front.png
    """
    from paraplan.search.pareto import pareto_front
    from paraplan.search.space import parse_fix

    try:
        sizes = [] if nodes is None else [int(x) for x in nodes.replace(" ", ",").split(",")
                                          if x.strip()]
    except ValueError:
        sizes = [0]
    if nodes is not None and (not sizes or not all(1 <= n <= 1_000_000 for n in sizes)):
        raise SpecError(f"--nodes={nodes[:60]!r} must be node counts from 1 to 1,000,000 like "
                        "4,8,16 (omit it to let pareto choose)", field="--nodes",
                        value=nodes[:60])
    spec_model = load_model(model)
    spec_cluster = load_cluster(cluster)
    training = read_training(global_batch, seq_len, precision)
    if plot is not None and Path(plot).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise SpecError(f"--plot={plot!r} must end in .png, .svg or .pdf", field="--plot",
                        value=plot, allowed=[".png", ".svg", ".pdf"])
    points = [p.to_dict() for p in pareto_front(spec_model, spec_cluster, training,
                                                 nodes=sizes or None, fix=parse_fix(fix),
                                                 limit=limit, trainer=read_trainer(trainer))]
    if plot is not None:
        from paraplan.viz.pareto import pareto_figure
        from paraplan.viz.timeline import save_figure

        save_figure(pareto_figure(points, f"{spec_model.name} on {spec_cluster.name}"), plot)
        if fmt is not Format.json:
            sys.stderr.write(f"wrote {plot}\n")
    if fmt is Format.json:
        emit_json({"points": points})
        return
    table = Table(title=f"Pareto front: {spec_model.name} on {spec_cluster.name}",
                  title_justify="left")
    for col in ("nodes", "plan", "tokens/s", "MFU", "headroom GiB", "$/hour", "$/M tokens"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    for p in points:
        table.add_row(str(p["nodes"]), p["plan_short"], f"{p['tokens_per_s']:,.0f}",
                      f"{100 * p['mfu']:.1f}%", f"{p['headroom_gib']:.1f}",
                      "-" if p["dollars_per_hour"] is None else f"{p['dollars_per_hour']:,.0f}",
                      "-" if p["dollars_per_million_tokens"] is None
                      else f"{p['dollars_per_million_tokens']:.3f}")
    console().print(table)
