"""``paraplan export PLAN --to FORMAT`` and the trainer-config writing shared with
``paraplan best --export``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from paraplan.cli.inputs import (
    TrainerOpt,
    read_json_file,
    read_plan,
    read_trainer,
    read_training,
    unwrap_plan_json,
)
from paraplan.export import FORMATS
from paraplan.specs import SpecError


def sidecar_path(out: str | Path) -> Path:
    """Where the plan JSON goes next to a trainer config: ``megatron.sh`` ->
    ``megatron.plan.json``."""
    return Path(out).with_suffix(".plan.json")


def write_export(fmt: str, ctx: Any, out: str | None, *, report: dict[str, Any] | None = None,
                 search: dict[str, Any] | None = None, quiet: bool = False) -> str:
    """Write ``ctx`` as ``fmt`` to ``out`` (atomically; a trainer config also gets the plan
    JSON beside it, so every derived quantity is on disk) or return the text when ``out`` is
    None. Raises ExportError / SpecError for plans the trainer cannot take or bad paths."""
    from paraplan.export import export_text
    from paraplan.export.files import write_atomic

    text = export_text(fmt, ctx, report=report, search=search)
    if out is None:
        return text
    if fmt != "json" and sidecar_path(out) == Path(out):
        raise SpecError(f"--out {out!r} would collide with its plan JSON; use another name",
                        field="--out", value=out)
    write_atomic(out, text)
    written = [str(out)]
    if fmt != "json":
        side = sidecar_path(out)
        write_atomic(side, export_text("json", ctx, report=report, search=search))
        written.append(str(side))
    if not quiet:
        sys.stderr.write("wrote " + " and ".join(written) + "\n")
    return text


def export_cmd(
    plan: Annotated[str, typer.Argument(
        help="A plan JSON (best --export json / export --to json: self-contained), or an "
             "inline plan / plan file / simulate report / best result with --model, "
             "--cluster, --global-batch and --seq-len.")],
    to: Annotated[str, typer.Option("--to", "-t", help="megatron, torchtitan, deepspeed, "
                                    "nanotron or json.")],
    out: Annotated[str | None, typer.Option(
        "--out", "-o", help="File to write (atomically; a plan JSON is written beside "
                            "it). Default: print to stdout.")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", "-c")] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", "-n")] = None,
    global_batch: Annotated[int | None, typer.Option("--global-batch", "-b")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", "-s")] = None,
    precision: Annotated[str, typer.Option(help="bf16, fp16, fp8 or fp32.")] = "bf16",
    trainer: TrainerOpt = None,
) -> None:
    """Write a plan as a trainer's configuration, after checking that trainer's rules:
    Megatron-LM flags (core_v0.15), torchtitan TOML (v0.2.2), DeepSpeed JSON, nanotron
    YAML, or the paraplan plan JSON with every derived quantity.

    Example: paraplan export tp=8,pp=4,vpp=5,sp=1,rc=selective,mbs=1 --to megatron
    --model llama3-70b --cluster dgx-h100 --nodes 32 --global-batch 1024 --seq-len 8192
    """
    if to not in FORMATS:
        raise SpecError(f"--to {to!r} is not an export format", field="--to", value=to,
                        allowed=list(FORMATS))
    ctx, report = _context(plan, model, cluster, nodes, global_batch, seq_len, precision,
                           read_trainer(trainer, to))
    text = write_export(to, ctx, out, report=report)
    if out is None:
        sys.stdout.write(text)


def _context(plan_text: str, model: str | None, cluster: str | None, nodes: int | None,
             global_batch: int | None, seq_len: int | None, precision: str, trainer: Any
             ) -> tuple[Any, dict[str, Any] | None]:
    """The ExportContext (and the simulator's report when the cluster is known) for PLAN."""
    from paraplan.export import export_context, is_plan_document, read_plan_document
    from paraplan.simulator.step import simulate
    from paraplan.specs.loaders import _as_path, load_cluster, load_model
    from paraplan.specs.plan import parse_plan
    from paraplan.specs.trainer import apply_trainer

    data: Any = None  # the JSON file's content, read once
    path = _as_path(plan_text) if "=" not in plan_text else None
    if path is not None and path.is_file() and path.suffix.lower() == ".json":
        data = read_json_file(path, "PLAN")
        if is_plan_document(data):
            given = [name for name, v in (("--model", model), ("--cluster", cluster),
                                          ("--nodes", nodes), ("--global-batch", global_batch),
                                          ("--seq-len", seq_len)) if v is not None]
            if given:
                raise SpecError(f"{plan_text!r} is a plan JSON with its own model, cluster and "
                                f"batch; drop {', '.join(given)} (or export from an inline "
                                "plan)", field=given[0], value=plan_text)
            ctx = read_plan_document(data)
            return ctx, data.get("prediction")
    missing = [name for name, v in (("--model", model), ("--cluster", cluster),
                                    ("--global-batch", global_batch), ("--seq-len", seq_len))
               if v is None]
    if missing:
        raise SpecError(f"exporting {plan_text!r} needs {', '.join(missing)} (or give a plan "
                        "JSON written by paraplan, which carries them)", field=missing[0],
                        value=None)
    run: dict = {}  # the MoE run setting a best result ranked the plan under
    spec_plan = (read_plan(plan_text, field="PLAN") if data is None
                 else parse_plan(unwrap_plan_json(data, plan_text, "PLAN", run)))
    spec_model = load_model(model)  # type: ignore[arg-type]
    spec_cluster = load_cluster(cluster, nodes=nodes)  # type: ignore[arg-type]
    # The plan as the trainer runs it (its overlaps, reduction dtype, dropout), so the written
    # config states them and the prediction beside it is that trainer's.
    training, spec_plan = apply_trainer(trainer, read_training(
        global_batch, seq_len, precision, moe_dispatcher=run.get("moe_dispatcher"),
        moe_a2a_overlap=run.get("moe_a2a_overlap"), moments_dtype=run.get("moments_dtype"),
        moe_dispatcher_sms=run.get("moe_dispatcher_sms"),
        moe_imbalance=run.get("moe_load_imbalance")),
        spec_plan)
    ctx = export_context(spec_model, training, spec_plan, cluster=spec_cluster)
    report = simulate(spec_model, spec_cluster, training, spec_plan, trainer=trainer).to_dict()
    return ctx, report
