"""The ``paraplan`` command line (typer + rich).

Every command takes ``--format table|json``; JSON goes to stdout and nothing else does (tables
and progress go to stdout only in table mode, errors always to stderr). Exit codes: 0 success,
2 bad input (one line naming the field, the value and what is allowed), 1 internal error.
"""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from paraplan.report_view import print_report
from paraplan.specs import (
    SpecError,
    list_profiles,
    load_cluster,
    load_gpu,
    load_link,
    load_model,
)

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


class Format(StrEnum):
    table = "table"
    json = "json"


FormatOpt = Annotated[
    Format, typer.Option("--format", "-f", help="table (for people) or json (for programs).")
]
# Goodput under failures (paraplan/simulator/goodput.py): shared by simulate and best.
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


def emit_json(data: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(data, indent=2, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float | int):
        return value
    return str(value)


def console() -> Console:
    return Console(soft_wrap=False, width=max(100, Console().width))


# ---- profiles --------------------------------------------------------------------------------
@app.command()
def profiles(fmt: FormatOpt = Format.table) -> None:
    """List the built-in GPUs, links, clusters and models (names you can type).

    Example: paraplan profiles --format json
    """
    names = {kind: list_profiles(kind) for kind in ("gpus", "links", "clusters", "models")}
    if fmt is Format.json:
        details = {
            "gpus": {n: _gpu_row(n) for n in names["gpus"]},
            "links": {n: _link_row(n) for n in names["links"]},
        }
        emit_json({**names, "details": details})
        return
    out = console()
    gpus = Table(title="GPUs", title_justify="left")
    for col in ("name", "bf16/fp16 TFLOP/s", "memory GiB", "mem BW GB/s", "matmul eff."):
        gpus.add_column(col, justify="left" if col == "name" else "right")
    for n in names["gpus"]:
        row = _gpu_row(n)
        gpus.add_row(n, f"{row['peak_16bit_tflops']:g}", f"{row['memory_GiB']:g}",
                     f"{row['memory_bandwidth_GBps']:g}", f"{row['matmul_efficiency']:.2f}")
    out.print(gpus)
    links = Table(title="Links (bandwidth one direction)", title_justify="left")
    for col in ("name", "kind", "GB/s", "latency us", "efficiency"):
        links.add_column(col, justify="left" if col in ("name", "kind") else "right")
    for n in names["links"]:
        row = _link_row(n)
        links.add_row(n, row["kind"], f"{row['bandwidth_GBps']:g}", f"{row['latency_us']:g}",
                      f"{row['efficiency']:.2f}")
    out.print(links)
    out.print("[bold]Clusters[/] (use --nodes N for the node count): "
              + ", ".join(names["clusters"]))
    out.print("[bold]Models[/] (or a Hugging Face config.json / YAML path): "
              + ", ".join(names["models"]))


def _gpu_row(name: str) -> dict[str, Any]:
    gpu = load_gpu(name)
    peak16 = max(gpu.peak_tflops.get("bf16", 0.0), gpu.peak_tflops.get("fp16", 0.0))
    return {
        "display_name": gpu.display_name,
        "peak_16bit_tflops": peak16,
        "peak_tflops": dict(gpu.peak_tflops),
        "memory_GiB": gpu.memory_GiB,
        "memory_bandwidth_GBps": gpu.memory_bandwidth_GBps,
        "matmul_efficiency": gpu.matmul_efficiency,
    }


def _link_row(name: str) -> dict[str, Any]:
    link = load_link(name)
    return {
        "kind": link.kind,
        "bandwidth_GBps": link.bandwidth_GBps,
        "latency_us": link.latency_us,
        "efficiency": link.efficiency,
    }


# ---- describe --------------------------------------------------------------------------------
@app.command()
def describe(
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Preset name, paraplan YAML or HF config.json."),
    ] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Preset name or cluster YAML.")
    ] = None,
    nodes: Annotated[
        int | None, typer.Option("--nodes", "-n", help="Number of nodes (one node type).")
    ] = None,
    plot: Annotated[str | None, typer.Option(
        "--plot", help="Draw the cluster topology to this PNG/SVG/PDF (needs --cluster).")
    ] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Show a model's shape and parameter counts, or a cluster's GPUs, peak and links.

    Examples: paraplan describe --model mixtral-8x7b;
    paraplan describe --cluster dgx-h100 --nodes 32 --format json
    """
    if model is None and cluster is None:
        raise SpecError("describe needs --model or --cluster (or both)", field="--model",
                        allowed="--model NAME|PATH, --cluster NAME|PATH")
    if nodes is not None and cluster is None:
        raise SpecError("--nodes needs --cluster", field="--nodes", value=nodes)
    if plot is not None and cluster is None:
        raise SpecError("--plot draws a cluster's topology and needs --cluster", field="--plot",
                        value=plot)
    _check_output_paths(plot=plot)
    result: dict[str, Any] = {}
    if model is not None:
        result["model"] = load_model(model).describe()
    if cluster is not None:
        result["cluster"] = _describe_cluster(cluster, nodes)
    if plot is not None and cluster is not None:
        from paraplan.viz.timeline import save_figure
        from paraplan.viz.topology import topology_figure

        save_figure(topology_figure(load_cluster(cluster, nodes=nodes)), plot, field="--plot")
        _wrote(plot, fmt)
    if fmt is Format.json:
        emit_json(result["model"] if len(result) == 1 and "model" in result
                  else result["cluster"] if len(result) == 1 else result)
        return
    out = console()
    if "model" in result:
        _print_model(out, result["model"])
    if "cluster" in result:
        _print_cluster(out, result["cluster"])


def _describe_cluster(ref: str, nodes: int | None) -> dict[str, Any]:
    spec = load_cluster(ref, nodes=nodes)
    info = spec.describe()
    gpu = spec.gpu
    info["gpu"] = gpu.name if spec.is_homogeneous else None
    info["peak_flops_per_gpu"] = {k: v * 1e12 for k, v in gpu.peak_tflops.items()} \
        if len(spec.gpu_types) == 1 else None
    info["memory_GiB_per_gpu"] = gpu.memory_GiB if len(spec.gpu_types) == 1 else None
    links: dict[str, Any] = {}
    for group in spec.node_groups:
        for link in (group.intra_node_link, group.inter_node_link):
            if link is not None:
                links[link.name] = link.model_dump(exclude={"sources", "notes"})
    if spec.intra_region_link is not None:
        links[spec.intra_region_link.name] = spec.intra_region_link.model_dump(
            exclude={"sources", "notes"})
    info["links"] = list(links.values())
    return info


def _print_model(out: Console, info: dict[str, Any]) -> None:
    shape = info["shape"]
    table = Table(title=f"model {info['name']}", title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value", justify="right")
    table.add_row("parameters", f"{info['num_params']:,} ({info['num_params_b']:.2f} B)")
    if info["num_active_params"] != info["num_params"]:
        table.add_row("active parameters", f"{info['num_active_params']:,} "
                      f"({info['num_active_params_b']:.2f} B)")
    for key, value in shape.items():
        if key not in ("name", "display_name"):
            table.add_row(key, str(value))
    out.print(table)


def _print_cluster(out: Console, info: dict[str, Any]) -> None:
    out.print(f"[bold]cluster {info['name']}[/]: {info['num_gpus']} GPUs on {info['num_nodes']} "
              f"nodes, {info['total_peak_16bit_pflops']:g} PFLOP/s 16-bit peak, "
              f"{info['total_memory_GiB']:g} GiB GPU memory")
    if info.get("description"):
        out.print(info["description"])
    table = Table(title="node groups", title_justify="left")
    for col in ("name", "region", "GPU", "GPUs/node", "nodes", "intra link (GB/s)",
                "NIC", "NICs", "NIC GB/s per GPU"):
        table.add_column(col)
    for g in info["node_groups"]:
        intra = f"{g['intra_node_link']} ({g['intra_node_bandwidth_GBps']:g})" \
            if g["intra_node_link"] else "-"
        table.add_row(str(g["name"] or "-"), g["region"], g["gpu"], str(g["gpus_per_node"]),
                      str(g["num_nodes"]), intra, g["inter_node_link"], str(g["nics_per_node"]),
                      f"{g['nic_bandwidth_per_gpu_GBps']:g}")
    out.print(table)
    if info["region_links"]:
        out.print(f"{len(info['region_links'])} WAN region links "
                  f"(latency {min(r['latency_ms'] for r in info['region_links']):g}-"
                  f"{max(r['latency_ms'] for r in info['region_links']):g} ms, bandwidth "
                  f"{min(r['bandwidth_Gbps'] for r in info['region_links']):g}-"
                  f"{max(r['bandwidth_Gbps'] for r in info['region_links']):g} Gb/s)")


# ---- simulate --------------------------------------------------------------------------------
def _read_plan(text: str, field: str = "--plan"):
    """A plan from inline text (tp=8,pp=4,...), a JSON object, or a JSON/YAML file path. A JSON
    file may also be a paraplan plan JSON (``best --export json``, ``export --to json``), a
    ``simulate`` report or a ``best`` result (its first feasible plan)."""
    from paraplan.specs.loaders import _as_path, read_yaml
    from paraplan.specs.plan import parse_plan

    looks_like_file = "=" not in text and not text.strip().startswith("{")
    path = _as_path(text) if looks_like_file else None
    if looks_like_file and path is None and text.lower().endswith((".json", ".yaml", ".yml")):
        raise SpecError(f"plan file {text!r} not found (give a path to a plan JSON/YAML, or an "
                        "inline plan such as tp=8,pp=4,mbs=1)", field=field, value=text)
    if path is not None and path.is_file():
        if path.suffix.lower() == ".json":
            return parse_plan(_unwrap_plan_json(_read_json_file(path, field), text, field))
        return parse_plan(read_yaml(path, "plan"))
    return parse_plan(text)


def _read_json_file(path: Path, field: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read JSON {str(path)!r}: {exc}", field=field,
                        value=str(path)) from None


def _unwrap_plan_json(data: Any, text: str, field: str) -> Any:
    """The plan inside a plan JSON, a StepReport or a ``best`` result (else ``data``)."""
    from paraplan.export.plan_json import is_plan_document

    if not isinstance(data, dict):
        return data
    if is_plan_document(data) and isinstance(data.get("plan"), dict):
        return data["plan"]
    if isinstance(data.get("plans"), list):
        feasible = [p for p in data["plans"] if isinstance(p, dict) and p.get("feasible", True)]
        if not feasible or not isinstance(feasible[0].get("plan"), dict):
            raise SpecError(f"{text!r} lists no feasible plan", field=field, value=text)
        return feasible[0]["plan"]
    if "feasible" in data and isinstance(data.get("plan"), dict):
        return data["plan"]
    return data


@app.command()
def simulate(
    model: Annotated[str, typer.Option("--model", "-m", help="Preset, YAML or HF config.json.")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Preset or cluster YAML.")],
    plan: Annotated[str, typer.Option("--plan", "-p",
                                      help="Inline tp=8,pp=4,mbs=1,... or a plan JSON/YAML file.")],
    global_batch: Annotated[int, typer.Option("--global-batch", "-b", help="Sequences per step.")],
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", help="Tokens per sequence.")],
    nodes: Annotated[int | None, typer.Option("--nodes", "-n", help="Number of nodes.")] = None,
    precision: Annotated[str, typer.Option(help="bf16, fp16, fp8 or fp32.")] = "bf16",
    no_flash: Annotated[bool, typer.Option("--no-flash-attention",
                                           help="Materialise s x s attention scores.")] = False,
    plot: Annotated[str | None, typer.Option(
        "--plot", help="Write the pipeline timeline and memory per stage to this PNG/SVG/PDF."
    )] = None,
    trace: Annotated[str | None, typer.Option(
        "--trace", help="Write the pipeline as a Chrome/Perfetto trace to this .json file."
    )] = None,
    mtbf_hours: MtbfOpt = None,
    checkpoint_write_s: CkptWriteOpt = None,
    storage_gbps: StorageOpt = None,
    restart_s: RestartOpt = None,
    preemption_rate: PreemptOpt = 0.0,
    fmt: FormatOpt = Format.table,
) -> None:
    """Simulate one plan: step time, MFU, memory per GPU and where the time goes.

    Example: paraplan simulate --model llama3-70b --cluster dgx-h100 --nodes 8
    --plan tp=8,pp=4,mbs=1,sp=1,rc=selective --global-batch 256 --seq-len 8192
    """
    from pydantic import ValidationError

    from paraplan.simulator.step import simulate as run_simulation
    from paraplan.specs.errors import from_validation_error
    from paraplan.specs.training import TrainingSpec

    _check_output_paths(plot=plot, trace=trace)
    spec_model = load_model(model)
    spec_cluster = load_cluster(cluster, nodes=nodes)
    spec_plan = _read_plan(plan)
    try:
        training = TrainingSpec(global_batch_size=global_batch, seq_len=seq_len,
                                precision=precision, flash_attention=not no_flash)
    except ValidationError as exc:
        raise from_validation_error(exc, "training") from None
    report = run_simulation(spec_model, spec_cluster, training, spec_plan).to_dict()
    gp = _goodput(report, spec_model, mtbf_hours, checkpoint_write_s, storage_gbps, restart_s,
                  preemption_rate)
    if gp is not None:
        report["goodput"] = gp
    _write_report_outputs(report, fmt, plot=plot, trace=trace)
    if fmt is Format.json:
        emit_json(report)
        return
    print_report(console(), report, f"{spec_model.name} on {spec_cluster.num_gpus}x "
                 f"{'+'.join(spec_cluster.gpu_types)}")
    if gp is not None:
        _print_goodput(console(), gp)


def _goodput(report: dict[str, Any], model: Any, mtbf_hours: float | None,
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
    if storage_gbps is not None and not storage_gbps > 0:
        raise SpecError(f"--storage-GBps={storage_gbps!r} must be > 0", field="--storage-GBps",
                        value=storage_gbps, allowed="> 0")
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


def _print_goodput(out: Console, gp: dict[str, Any]) -> None:
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


def _check_output_paths(*, plot: str | None = None, trace: str | None = None) -> None:
    """Reject a bad --plot (not .png/.svg/.pdf) or --trace (not .json) before any work."""
    if plot is not None:
        from paraplan.viz.timeline import check_figure_path

        check_figure_path(plot, "--plot")
    if trace is not None and (Path(trace).suffix.lower() != ".json" or Path(trace).is_dir()):
        raise SpecError(f"--trace={trace!r} must be a file name ending in .json", field="--trace",
                        value=trace, allowed=[".json"])


def _wrote(path: str, fmt: Format) -> None:
    """Tell a person (not a program reading JSON) which file was written."""
    if fmt is not Format.json:
        sys.stderr.write(f"wrote {path}\n")


def _write_report_outputs(report: dict[str, Any], fmt: Format, *, plot: str | None = None,
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
        _wrote(plot, fmt)
    if trace is not None:
        from paraplan.viz.trace import write_chrome_trace

        write_chrome_trace(report, trace, field="--trace")
        _wrote(trace, fmt)


# ---- best ------------------------------------------------------------------------------------
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


@app.command()
def best(
    model: Annotated[str, typer.Option("--model", "-m", help="Preset, YAML or HF config.json.")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Preset or cluster YAML.")],
    global_batch: Annotated[int, typer.Option("--global-batch", "-b", help="Sequences per step.")],
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", help="Tokens per sequence.")],
    nodes: Annotated[int | None, typer.Option("--nodes", "-n", help="Number of nodes.")] = None,
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
    seed: Annotated[int, typer.Option(help="Seed of the evolutionary searcher.")] = 0,
    plot: Annotated[str | None, typer.Option(
        "--plot", help="Write the best plan's pipeline timeline and memory per stage to this "
        "PNG/SVG/PDF.")] = None,
    mtbf_hours: MtbfOpt = None,
    checkpoint_write_s: CkptWriteOpt = None,
    storage_gbps: StorageOpt = None,
    restart_s: RestartOpt = None,
    preemption_rate: PreemptOpt = 0.0,
    relaxed: Annotated[bool, typer.Option(
        "--relaxed", help="Also search DiLoCo (H=10, 100), PowerSGD, 8/4-bit gradients and "
        "8/4-bit pipeline activations; bytes only, convergence not modelled.")] = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """Find the fastest plans that fit: a ranked table with step time, MFU, memory per GPU and
    where the time goes.

    Example: paraplan best --model llama3-70b --cluster dgx-h100 --nodes 32
    --global-batch 1024 --seq-len 8192 --top 5
    """
    from pydantic import ValidationError

    from paraplan.search import search as run_search
    from paraplan.specs.errors import from_validation_error
    from paraplan.specs.training import TrainingSpec

    if export is not None and out is None:
        raise SpecError("--export needs --out PATH", field="--out", value=None)
    if out is not None and export is None:
        raise SpecError("--out needs --export FORMAT", field="--export", value=None,
                        allowed=[e.value for e in ExportFormat])
    _check_output_paths(plot=plot)
    spec_model = load_model(model)
    spec_cluster = load_cluster(cluster, nodes=nodes)
    try:
        training = TrainingSpec(global_batch_size=global_batch, seq_len=seq_len,
                                precision=precision, flash_attention=not no_flash)
    except ValidationError as exc:
        raise from_validation_error(exc, "training") from None
    if relaxed:
        from paraplan.search.relaxed import relaxed_search

        err = Console(stderr=True)
        result = relaxed_search(spec_model, spec_cluster, training, searcher=searcher.value,
                                top=top, fix=fix, seed=seed,
                                progress=(lambda m: err.print(f"[dim]{m}[/]"))
                                if fmt is not Format.json else None)
    else:
        bar = _LazyProgress(f"searching ({searcher.value})", enabled=sys.stderr.isatty())
        try:
            result = run_search(spec_model, spec_cluster, training, searcher=searcher.value,
                                top=top, fix=fix, progress=bar, seed=seed)
        finally:
            bar.close()
    data = result.to_dict()
    if explain:
        data["explain"] = _explain(data)
    gp = _goodput(data["plans"][0] if data["plans"] else {}, spec_model, mtbf_hours,
                  checkpoint_write_s, storage_gbps, restart_s, preemption_rate)
    if gp is not None:
        data["goodput"] = gp
    if plot is not None and data["plans"]:
        _write_report_outputs(data["plans"][0], fmt, plot=plot)
    if export is not None and out is not None:
        _export_best(result, data, spec_model, spec_cluster, training, export.value, out,
                     quiet=fmt is Format.json)
    if fmt is Format.json:
        emit_json(data)
        return
    _print_best(console(), data, spec_model.name, spec_cluster)
    if relaxed:
        _print_relaxed(console(), data["relaxed"])
    if gp is not None:
        _print_goodput(console(), gp)


def _print_relaxed(out: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title="best plan per relaxed-synchronization setting", title_justify="left")
    for col, just in (("setting", "left"), ("best plan", "left"), ("step", "right"),
                      ("vs dense", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        if r["best_step_time_s"] is None:
            table.add_row(r["label"], "no plan fits", "-", "-")
            continue
        table.add_row(r["label"], r["best_plan"] or "", _fmt_time(r["best_step_time_s"]),
                      "-" if r["speedup_vs_dense"] is None else f"{r['speedup_vs_dense']:.2f}x")
    out.print(table)


def _export_best(result: Any, data: dict[str, Any], model: Any, cluster: Any, training: Any,
                 fmt: str, out: str, *, quiet: bool) -> None:
    """Write the best feasible plan of a search as ``fmt`` (see ``paraplan export``); the plan
    JSON keeps the whole search result under ``search``."""
    from paraplan.cli_export import write_export
    from paraplan.export import export_context
    from paraplan.specs.plan import parse_plan

    best = next((r for r in result.reports if r.feasible), None)
    if best is None:
        raise SpecError("--export: the search found no feasible plan to export",
                        field="--export", value=fmt)
    ctx = export_context(model, training, parse_plan(best.plan), cluster=cluster)
    search = json.loads(json.dumps(data, default=_json_default))
    write_export(fmt, ctx, out, report=best.to_dict(), search=search, quiet=quiet)



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


def _fmt_time(x: float) -> str:
    return f"{x:,.1f} s" if x >= 100 else f"{x:.3f} s" if x >= 1 else f"{x * 1e3:.1f} ms"


def _print_best(out: Console, data: dict[str, Any], model_name: str, cluster: Any) -> None:
    plans = data["plans"]
    out.print(f"[bold]{model_name}[/] on {cluster.num_gpus}x {'+'.join(cluster.gpu_types)}: "
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
        table.add_row(str(i), rep.get("plan_short", ""), _fmt_time(total),
                      f"{100 * rep['mfu']:.1f}%", f"{rep['tokens_per_s']:,.0f}",
                      f"{rep['memory_gb']['peak']:.1f} / {rep.get('memory_capacity_gb', 0):g}",
                      where)
    out.print(table)
    base = data.get("baseline_step_time_s")
    if base and plans and base > plans[0]["step_time_s"] * (1 + 1e-9):
        out.print(f"baseline (rank-order placement): {_fmt_time(base)}; the best plan is "
                  f"{base / plans[0]['step_time_s']:.2f}x faster")
    for note in data.get("notes", []):
        out.print(f"[dim]note: {note}[/]")
    if "explain" in data:
        ex = data["explain"]
        cmp_ = ex.get("first_vs_second")
        if cmp_:
            out.print(f"\n[bold]why #1 beats #2[/] ({cmp_['second']} is "
                      f"{_fmt_time(cmp_['step_time_gap_s'])} slower):")
            for k, v in sorted(cmp_["time_s_second_minus_first"].items(),
                               key=lambda kv: -abs(kv[1])):
                if abs(v) > 1e-9:
                    out.print(f"  {k:<10} {'+' if v > 0 else '-'}{_fmt_time(abs(v))}")
            dm = cmp_["memory_gb_second_minus_first"]["peak"]
            out.print(f"  memory     {dm:+.1f} GiB per GPU (peak)")
        if ex["top_rejections"]:
            out.print(f"\n[bold]rejected[/] ({data.get('considered', 0):,} plans considered):")
            for reason, n in ex["top_rejections"].items():
                out.print(f"  {n:>12,}  {reason}")


@app.command()
def pareto(
    model: Annotated[str, typer.Option("--model", "-m", help="Preset, YAML or HF config.json.")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Preset or cluster YAML.")],
    global_batch: Annotated[int, typer.Option("--global-batch", "-b", help="Sequences per step.")],
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", help="Tokens per sequence.")],
    nodes: Annotated[str, typer.Option(
        "--nodes", "-n", help="Node counts to compare, e.g. 4,8,16,32.")] = "",
    fix: Annotated[str | None, typer.Option(help="Pin parts of the plan, e.g. tp=8.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="At most this many points.")] = 25,
    precision: Annotated[str, typer.Option(help="bf16, fp16, fp8 or fp32.")] = "bf16",
    plot: Annotated[str | None, typer.Option(
        "--plot", help="Write the front to this PNG/SVG/PDF.")] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Pareto front of throughput vs memory headroom vs $ per hour across cluster sizes.

    Example: paraplan pareto --model llama3-70b --cluster dgx-h100 --nodes 4,8,16,32
    --global-batch 512 --seq-len 8192 --plot front.png
    """
    from pydantic import ValidationError

    from paraplan.search.pareto import pareto_front
    from paraplan.search.space import parse_fix
    from paraplan.specs.errors import from_validation_error
    from paraplan.specs.training import TrainingSpec

    try:
        sizes = [int(x) for x in nodes.replace(" ", ",").split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"--nodes={nodes!r} must be node counts like 4,8,16", field="--nodes",
                        value=nodes) from None
    spec_model = load_model(model)
    spec_cluster = load_cluster(cluster)
    try:
        training = TrainingSpec(global_batch_size=global_batch, seq_len=seq_len,
                                precision=precision)
    except ValidationError as exc:
        raise from_validation_error(exc, "training") from None
    if plot is not None and Path(plot).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise SpecError(f"--plot={plot!r} must end in .png, .svg or .pdf", field="--plot",
                        value=plot, allowed=[".png", ".svg", ".pdf"])
    points = [p.to_dict() for p in pareto_front(spec_model, spec_cluster, training,
                                                 nodes=sizes or None, fix=parse_fix(fix),
                                                 limit=limit)]
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


# ---- validate-published ----------------------------------------------------------------------
@app.command("validate-dtfm")
def validate_dtfm_cmd(
    scenario: Annotated[list[str] | None, typer.Option(
        "--scenario", help="datacenter, spot, multi-university, regional or worldwide "
        "(repeat; default: all five).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the evolutionary searcher.")] = 0,
    fmt: FormatOpt = Format.table,
) -> None:
    """DT-FM reproduction: GPT-3 XL on the five dtfm-* scenarios, topology-aware scheduling vs
    random placement, next to the speedups DT-FM measured.

    Example: paraplan validate-dtfm --scenario worldwide
    """
    from paraplan.validate.dtfm import dtfm_reference, reproduce

    known = [r["scenario"] for r in dtfm_reference()]
    for name in scenario or []:
        if name not in known:
            raise SpecError(f"--scenario {name!r} is not a DT-FM scenario; use one of "
                            f"{', '.join(known)}", field="--scenario", value=name,
                            allowed=known)
    err = Console(stderr=True)
    data = reproduce(scenario or None, seed=seed,
                     progress=(lambda m: err.print(f"[dim]{m}[/]")) if fmt is not Format.json
                     else None)
    if fmt is Format.json:
        emit_json(data)
        return
    table = Table(title="GPT-3 XL (24 layers, seq 2048, batch 1024, fp16), 64 V100: "
                  "scheduled vs random placement", title_justify="left")
    for col in ("scenario", "plan", "scheduled s", "random s", "rank order s", "speedup",
                "DT-FM speedup", "DT-FM scheduled s", "error %"):
        table.add_column(col, justify="left" if col in ("scenario", "plan") else "right")
    for r in data["rows"]:
        if r.get("plan") is None:
            table.add_row(r["scenario"], "no plan fits", *["-"] * 7)
            continue
        table.add_row(r["scenario"], r["plan"], f"{r['scheduled_s']:.2f}",
                      f"{r['random_s']:.2f}", f"{r['rank_order_s']:.2f}",
                      f"{r['speedup_vs_random']:.2f}x", f"{r['dtfm_speedup']:.2f}x",
                      f"{r['dtfm_with_scheduler_s']:.2f}", f"{r['scheduled_error_pct']:+.1f}")
    console().print(table)


@app.command("validate-published")
def validate_published_cmd(
    csv_path: Annotated[str | None, typer.Argument(
        help="Published-runs CSV (throughput or memory format), or a bundled set: "
             "throughput (default), memory, holdout.")] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Predict every published run in CSV and report the error (per row, per source, MAPE).

    Example: paraplan validate-published shared/validation/published_throughput.csv
    """
    from paraplan.specs.loaders import _as_path
    from paraplan.validate.predict import run_memory, run_published
    from paraplan.validate.published import DATA_DIR

    bundled = {"throughput": DATA_DIR / "published_throughput.csv",
               "memory": DATA_DIR / "published_memory.csv",
               "holdout": DATA_DIR / "holdout" / "holdout_throughput.csv"}
    if csv_path in bundled:
        csv_path = str(bundled[csv_path])
    is_memory = False
    if csv_path is not None:
        path = _as_path(csv_path)
        if path is None or not path.is_file():
            raise SpecError(f"CSV file {csv_path!r} not found", field="CSV", value=csv_path)
        try:
            header = path.read_text(encoding="utf-8").split("\n", 1)[0]
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"cannot read CSV {csv_path!r}: {exc}", field="CSV") from None
        if "memory_scope" in header:
            is_memory = True
        elif "measured_metric" not in header:
            raise SpecError(f"CSV {csv_path!r} is neither the throughput format (needs column "
                            "measured_metric) nor the memory format (memory_scope); see "
                            "shared/validation/README.md", field="CSV", value=csv_path)
    result = run_memory(csv_path) if is_memory else run_published(csv_path)
    if fmt is Format.json:
        emit_json(result)
        return
    _print_validation(console(), result)


def _print_validation(out: Console, result: dict[str, Any]) -> None:
    table = Table(title="error vs published runs (MAPE on step time; memory rows on GiB)",
                  title_justify="left")
    for col in ("source", "rows", "predicted", "MAPE %", "MAPE % (plan certain)", "worst row"):
        table.add_column(col, justify="left" if col == "source" else "right")
    for src, info in result["by_source"].items():
        worst = info.get("worst_row")
        table.add_row(
            src, str(info.get("n_rows", "")), str(info["n"]),
            "-" if info["mape_pct"] is None else f"{info['mape_pct']:.1f}",
            "-" if info.get("mape_pct_certain") is None else f"{info['mape_pct_certain']:.1f}",
            "-" if not worst else f"#{worst['index']} {worst['model']} {worst['error_pct']:+.1f}%",
        )
    overall = result["mape_pct"]
    table.add_row("[bold]all[/]", str(result["n_rows"]), str(result["n_predicted"]),
                  "-" if overall is None else f"[bold]{overall:.1f}[/]",
                  "-" if result.get("mape_pct_certain") is None
                  else f"{result['mape_pct_certain']:.1f}",
                  f"coverage {result.get('coverage_pct', 0):.0f}%")
    out.print(table)
    skipped = [r for r in result["rows"] if r["status"] != "ok"]
    if skipped:
        out.print(f"{len(skipped)} rows not predicted:")
        for r in skipped[:20]:
            out.print(f"  #{r['index']} {r['source_id']} {r['model']}: {r['status']}: "
                      f"{r['reason']}")


# ---- run, calibrate, validate-executor (paraplan/cli_executor.py) ---------------------------
from paraplan.cli_executor import register as _register_executor  # noqa: E402

_register_executor(app, Format, FormatOpt, emit_json)

# ---- export (paraplan/cli_export.py) ---------------------------------------------------------
from paraplan.cli_export import register as _register_export  # noqa: E402

_register_export(app)

# ---- explain (paraplan/cli_explain.py) --------------------------------------------------------
from paraplan.cli_explain import register as _register_explain  # noqa: E402

_register_explain(app, Format, FormatOpt, emit_json)


# ---- entry point -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Console-script entry: map bad input to exit 2 with one line, crashes to exit 1."""
    args = sys.argv[1:] if argv is None else argv
    try:
        result = app(args=args, prog_name="paraplan", standalone_mode=False)
        return int(result) if isinstance(result, int) else 0
    except SpecError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
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


def _console_script() -> None:  # pragma: no cover - thin wrapper
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    _console_script()
