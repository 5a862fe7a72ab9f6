"""``paraplan simulate`` (one plan: step time, MFU, memory, where the time goes, or why it is
infeasible) and ``paraplan explain`` (that plan in plain words, and the one-knob changes that
help, each simulated)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from paraplan.cli import goodput
from paraplan.cli.common import Format, FormatOpt, console, emit_json, write_report_outputs
from paraplan.cli.inputs import (
    MoeDispatcherOpt,
    MoeDispatcherSmsOpt,
    MoeHostSyncOpt,
    MoeImbalanceOpt,
    MoeOverlapOpt,
    MomentsDtypeOpt,
    TrainerOpt,
    apply_imported,
    check_output_paths,
    read_plan,
    read_plan_source,
    read_trainer,
    read_training,
)
from paraplan.cli.report_view import print_report
from paraplan.specs import load_cluster, load_model


def simulate(
    model: Annotated[str, typer.Option("--model", "-m", help="Preset, YAML or HF config.json.")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Preset or cluster YAML.")],
    plan: Annotated[str, typer.Option("--plan", "-p",
                                      help="Inline tp=8,pp=4,mbs=1,... or a plan JSON/YAML file.")],
    global_batch: Annotated[int, typer.Option("--global-batch", "-b", help="Sequences per step.")],
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", help="Tokens per sequence.")],
    nodes: Annotated[int | None, typer.Option("--nodes", "-n", min=1, max=1_000_000,
                                              help="Number of nodes.")] = None,
    precision: Annotated[str, typer.Option(help="bf16, fp16, fp8 or fp32.")] = "bf16",
    no_flash: Annotated[bool, typer.Option("--no-flash-attention",
                                           help="Materialise s x s attention scores.")] = False,
    plot: Annotated[str | None, typer.Option(
        "--plot", help="Write the pipeline timeline and memory per stage to this PNG/SVG/PDF."
    )] = None,
    trace: Annotated[str | None, typer.Option(
        "--trace", help="Write the pipeline as a Chrome/Perfetto trace to this .json file."
    )] = None,
    mtbf_hours: goodput.MtbfOpt = None,
    checkpoint_write_s: goodput.CkptWriteOpt = None,
    storage_gbps: goodput.StorageOpt = None,
    restart_s: goodput.RestartOpt = None,
    preemption_rate: goodput.PreemptOpt = 0.0,
    trainer: TrainerOpt = None,
    moe_dispatcher: MoeDispatcherOpt = None,
    moe_a2a_overlap: MoeOverlapOpt = None,
    moe_imbalance: MoeImbalanceOpt = None,
    moe_host_sync_ms: MoeHostSyncOpt = None,
    moe_dispatcher_sms: MoeDispatcherSmsOpt = None,
    moments_dtype: MomentsDtypeOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Simulate one plan: step time, MFU, memory per GPU and where the time goes, as the
    trainer (default megatron-core) runs it; a plan it cannot express is infeasible.

    Example: paraplan simulate --model llama3-70b --cluster dgx-h100 --nodes 8
    --plan tp=8,pp=4,mbs=1,sp=1,rc=selective --global-batch 256 --seq-len 8192
    """
    from paraplan.simulator.step import simulate as run_simulation

    check_output_paths(plot=plot, trace=trace)
    spec_model = load_model(model)
    spec_cluster = load_cluster(cluster, nodes=nodes)
    run: dict = {}  # the MoE run setting a best result ranked the plan under
    spec_plan, imported = read_plan_source(plan, run=run)
    training = read_training(
        global_batch, seq_len, precision, flash_attention=not no_flash,
        moe_dispatcher=run.get("moe_dispatcher") if moe_dispatcher is None else moe_dispatcher,
        moe_a2a_overlap=run.get("moe_a2a_overlap") if moe_a2a_overlap is None
        else moe_a2a_overlap,
        moe_imbalance=run.get("moe_load_imbalance") if moe_imbalance is None else moe_imbalance,
        moments_dtype=run.get("moments_dtype") if moments_dtype is None else moments_dtype,
        moe_host_sync_ms=moe_host_sync_ms,
        moe_dispatcher_sms=run.get("moe_dispatcher_sms") if moe_dispatcher_sms is None
        else moe_dispatcher_sms)
    if imported is not None:  # the user's own trainer config: price it as that trainer runs it
        training = apply_imported(imported, spec_model, training)
    spec_trainer = read_trainer(trainer if trainer or imported is None else imported.trainer)
    if moe_dispatcher_sms is not None and not (
            spec_model.is_moe and training.moe_dispatcher == "hierarchical"
            and training.moe_a2a_overlap):
        # Say so rather than ignore it silently: the count prices only the flex dispatcher's
        # kernels beside the compute they overlap.
        sys.stderr.write("note: --moe-dispatcher-sms changes nothing here: it prices the "
                         "hierarchical dispatcher's kernels under --moe-a2a-overlap\n")
    report = run_simulation(spec_model, spec_cluster, training, spec_plan,
                            trainer=spec_trainer).to_dict()
    gp = goodput.goodput_section(report, spec_model, mtbf_hours, checkpoint_write_s, storage_gbps,
                                 restart_s, preemption_rate)
    if gp is not None:
        report["goodput"] = gp
    write_report_outputs(report, fmt, plot=plot, trace=trace)
    if fmt is Format.json:
        emit_json(report)
        return
    print_report(console(), report, f"{spec_model.name} on {spec_cluster.num_gpus}x "
                 f"{'+'.join(spec_cluster.gpu_types)} with {spec_trainer.label}")
    if gp is not None:
        goodput.print_goodput(console(), gp)


def explain_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="Preset, YAML or HF "
                                       "config.json.")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Preset or cluster "
                                         "YAML.")],
    plan: Annotated[str, typer.Option("--plan", "-p", help="Inline tp=8,pp=4,mbs=1,... "
                                      "or a plan file / plan JSON.")],
    global_batch: Annotated[int, typer.Option("--global-batch", "-b",
                                              help="Sequences per step.")],
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", help="Tokens per sequence.")],
    nodes: Annotated[int | None, typer.Option("--nodes", "-n",
                                              help="Number of nodes.")] = None,
    precision: Annotated[str, typer.Option(help="bf16, fp16, fp8 or fp32.")] = "bf16",
    top: Annotated[int, typer.Option("--top", "-k", min=1, max=50,
                                     help="How many better changes to list.")] = 5,
    trainer: TrainerOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Explain one plan in plain words (where the step goes and why) and list the one-knob
    changes that make it faster or make it fit, each simulated.

    Example: paraplan explain --model llama3-70b --cluster dgx-h100 --nodes 32
    --plan tp=8,pp=8,mbs=4,sp=1,rc=full --global-batch 1024 --seq-len 8192
    """
    from paraplan.explain import explain

    spec_plan = read_plan(plan)
    spec_model, spec_cluster = load_model(model), load_cluster(cluster, nodes=nodes)
    training = read_training(global_batch, seq_len, precision)
    spec_trainer = read_trainer(trainer)
    data = explain(spec_model, spec_cluster, training, spec_plan, top=top, trainer=spec_trainer)
    if fmt is Format.json:
        emit_json(data)
        return
    out = Console()
    out.print(f"[bold]{data['plan']}[/] for {spec_model.name} on {spec_cluster.num_gpus}x "
              f"{'+'.join(spec_cluster.gpu_types)} with {spec_trainer.label}")
    for line in data["findings"]:
        out.print(f"  - {line}")
    alts = data["alternatives"]
    if not alts:
        out.print("no single change of micro-batch size, SP, recompute, ZeRO stage, "
                  "virtual stages, tp/pp/dp degrees" + (" or MoE run setting" if
                                                        spec_model.is_moe else "")
                  + (" is faster" if data["feasible"] else " makes it fit"))
        return
    table = Table(title="one-knob changes that help (simulated)", title_justify="left")
    for col, just in (("change", "left"), ("plan", "left"), ("step", "right"),
                      ("speedup", "right"), ("MFU", "right"), ("mem GiB", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for a in alts:
        table.add_row(a["change"], a["plan"], f"{a['step_time_s']:.4g} s",
                      "-" if a["speedup"] is None else f"{a['speedup']:.2f}x",
                      f"{100 * a['mfu']:.1f}%", f"{a['memory_peak_gb']:.1f}")
    out.print(table)
