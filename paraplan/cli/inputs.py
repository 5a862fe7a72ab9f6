"""Reading what a user types: plans (inline, files, plan JSON, reports, search results), the
training arguments, and output paths checked before any work."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from paraplan.specs import SpecError
from paraplan.specs.safe_io import parse_json, read_user_text

DEFAULT_TRAINER = "megatron-core"
"""The trainer the CLI prices and searches for unless told otherwise (the most common
large-scale trainer); ``--trainer generic`` is every knob paraplan can price."""

TrainerOpt = Annotated[str | None, typer.Option(
    "--trainer", help="Trainer profile (megatron-core, megatron-lm-2021, torchtitan, deepspeed, "
    "nanotron, llm-foundry, generic) or a profile YAML: only plans it can run, priced as it "
    "runs them. Default: megatron-core (best --export X: X's trainer).")]

MoeDispatcherOpt = Annotated[str | None, typer.Option(
    "--moe-dispatcher", help="MoE token dispatch: alltoall (NCCL) or hierarchical (DeepEP / "
    "HybridEP, one copy per remote node). Default: the trainer's.")]
MoeOverlapOpt = Annotated[bool | None, typer.Option(
    "--moe-a2a-overlap/--no-moe-a2a-overlap", help="Hide expert-parallel all-to-alls behind "
    "another micro-batch's compute (Megatron --overlap-moe-expert-parallel-comm). Default: "
    "the trainer's.")]
TRAINING_FLAGS = {"global_batch_size": "--global-batch", "seq_len": "--seq-len",
                  "precision": "--precision", "moe_dispatcher": "--moe-dispatcher",
                  "moe_load_imbalance": "--moe-imbalance", "moments_dtype": "--moments-dtype",
                  "moe_dispatcher_sms": "--moe-dispatcher-sms"}
"""The TrainingSpec fields the command line sets, by the option that sets them."""
MomentsDtypeOpt = Annotated[str | None, typer.Option(
    "--moments-dtype", help="Adam moments in fp32 (default) or bf16 (Megatron "
    "--use-precision-aware-optimizer --exp-avg-dtype bf16, as DeepSeek-V3 trains): 8 instead of "
    "12 optimizer bytes per parameter.")]
MoeHostSyncOpt = Annotated[float | None, typer.Option(
    "--moe-host-sync-ms", help="GPU idle per MoE layer forward while the host catches up after "
    "the dispatcher's device-to-host sync, ms on a DGX H100 host (Grace hosts scale it). "
    "Default: the trainer's (megatron-core 0.616, NVIDIA's profile; 0 for sync-free MoE under "
    "full CUDA graphs, core_v0.18+).")]
MoeDispatcherSmsOpt = Annotated[int | None, typer.Option(
    "--moe-dispatcher-sms", help="SMs the hierarchical (DeepEP/HybridEP) dispatcher's kernels "
    "hold, taken from the compute they overlap (Megatron --moe-flex-dispatcher-num-sms; default "
    "20, DeepEP's; NVIDIA's HybridEP benchmarks use 32).")]
MoeImbalanceOpt = Annotated[float | None, typer.Option(
    "--moe-imbalance", help="Routed tokens on the busiest expert-parallel rank over the mean "
    "(default 1.3; 1.0 = forced balance, as NVIDIA's MoE benchmarks).")]


def read_plan(text: str, field: str = "--plan"):
    """A plan from inline text (tp=8,pp=4,...), a JSON object, or a JSON/YAML file path. A JSON
    file may also be a paraplan plan JSON (``best --export json``, ``export --to json``), a
    ``simulate`` report or a ``best`` result (its first feasible plan); a trainer config
    (Megatron args, torchtitan TOML, DeepSpeed JSON, nanotron YAML) gives its plan."""
    return read_plan_source(text, field)[0]


def read_plan_source(text: str, field: str = "--plan",
                     run: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """(plan, the trainer config it came from or None): ``read_plan`` that also says when the
    plan was read from a trainer's own config (``paraplan.importers``). A ``run`` dict gets
    the MoE run setting a ``best`` result or report ranked the plan under
    (``unwrap_plan_json``)."""
    from paraplan.importers import read_trainer_config
    from paraplan.specs.loaders import _as_path, read_yaml
    from paraplan.specs.plan import parse_plan

    looks_like_file = "=" not in text and not text.strip().startswith("{")
    path = _as_path(text) if looks_like_file else None
    if looks_like_file and path is None and text.lower().endswith(
            (".json", ".yaml", ".yml", ".toml", ".sh")):
        raise SpecError(f"plan file {text!r} not found (give a path to a plan JSON/YAML, a "
                        "trainer config, or an inline plan such as tp=8,pp=4,mbs=1)",
                        field=field, value=text)
    if path is not None and path.is_file():
        content = read_user_text(path, "plan")
        imported = read_trainer_config(path, content)
        if imported is not None:
            return imported.plan, imported
        if path.suffix.lower() == ".json":
            return parse_plan(unwrap_plan_json(read_json_file(path, field), text, field,
                                               run)), None
        return parse_plan(read_yaml(path, "plan")), None
    return parse_plan(text), None


def apply_imported(imported: Any, model: Any, training: Any) -> Any:
    """``training`` with the run facts a trainer config states (dropout, reduction dtype,
    kernels). Its batch, sequence length, precision and model shape must match the command
    line's: a difference is an error naming both values."""
    checked = (("global_batch_size", "--global-batch"), ("seq_len", "--seq-len"),
               ("precision", "--precision"))
    for key, flag in checked:
        if key in imported.training and imported.training[key] != getattr(training, key):
            raise SpecError(f"{imported.path} sets {key}={imported.training[key]!r} but "
                            f"{flag} is {getattr(training, key)!r}; give {flag} "
                            f"{imported.training[key]}", field=flag,
                            value=getattr(training, key))
    # MoE run settings the file states and the command line also gives: the file would win
    # silently, so a difference is an error too.
    for key, flag in (("moe_dispatcher", "--moe-dispatcher"),
                      ("moe_a2a_overlap", "--moe-a2a-overlap"),
                      ("moments_dtype", "--moments-dtype"),
                      ("moe_dispatcher_sms", "--moe-dispatcher-sms")):
        if key in imported.training and key in training.model_fields_set \
                and imported.training[key] != getattr(training, key):
            raise SpecError(f"{imported.path} sets {key}={imported.training[key]!r} but "
                            f"{flag} gives {getattr(training, key)!r}; drop {flag} or edit "
                            "the file", field=flag, value=getattr(training, key))
    for key, value in imported.model.items():
        if getattr(model, key) != value:
            raise SpecError(f"{imported.path} is for a model with {key}={value}, not "
                            f"{model.name} ({key}={getattr(model, key)})", field="--model",
                            value=model.name)
    return training.model_copy(update={k: v for k, v in imported.training.items()
                                       if k not in dict(checked)})


def read_json_file(path: Path, field: str) -> Any:
    return parse_json(read_user_text(path, field), "JSON file", str(path))


def unwrap_plan_json(data: Any, text: str, field: str, run: dict[str, Any] | None = None
                     ) -> Any:
    """The plan inside a plan JSON, a StepReport or a ``best`` result (else ``data``). A
    ``run`` dict gets the MoE run setting (``moe_dispatcher``, ``moe_a2a_overlap``, the flex
    dispatcher's ``moe_dispatcher_sms``, a routing imbalance the user set) and the
    optimizer's ``moments_dtype`` the report or the best plan was priced with, so it is
    priced and exported as ranked."""
    from paraplan.export.plan_json import is_plan_document
    from paraplan.search.moe_runs import MOE_RUN_FIELDS

    def keep(report: dict) -> None:
        if run is not None:
            run.update({k: report[k] for k in (*MOE_RUN_FIELDS, "moments_dtype")
                        if isinstance(report.get(k), bool | str)})
            sms, imbalance = report.get("moe_dispatcher_sms"), report.get("moe_load_imbalance")
            if isinstance(sms, int) and not isinstance(sms, bool):
                run["moe_dispatcher_sms"] = sms
            if isinstance(imbalance, int | float) and not isinstance(imbalance, bool):
                run["moe_load_imbalance"] = float(imbalance)

    if not isinstance(data, dict):
        return data
    if is_plan_document(data) and isinstance(data.get("plan"), dict):
        return data["plan"]
    if isinstance(data.get("plans"), list):
        feasible = [p for p in data["plans"] if isinstance(p, dict) and p.get("feasible", True)]
        if not feasible or not isinstance(feasible[0].get("plan"), dict):
            raise SpecError(f"{text!r} lists no feasible plan", field=field, value=text)
        keep(feasible[0])
        return feasible[0]["plan"]
    if isinstance(data.get("plan"), dict):
        keep(data)
    if "feasible" in data and isinstance(data.get("plan"), dict):
        return data["plan"]
    return data


def read_training(global_batch: int | None, seq_len: int | None, precision: str,
                  flash_attention: bool = True, *, moe_dispatcher: str | None = None,
                  moe_a2a_overlap: bool | None = None, moe_imbalance: float | None = None,
                  moments_dtype: str | None = None, moe_host_sync_ms: float | None = None,
                  moe_dispatcher_sms: int | None = None) -> Any:
    """The TrainingSpec of --global-batch, --seq-len, --precision (and --no-flash-attention,
    --moments-dtype, the --moe-* options: those left out stay the trainer's); a bad value is
    a SpecError naming the field."""
    from pydantic import ValidationError

    from paraplan.specs.errors import from_validation_error
    from paraplan.specs.training import TrainingSpec

    moe = {k: v for k, v in (("moe_dispatcher", moe_dispatcher),
                             ("moe_a2a_overlap", moe_a2a_overlap),
                             ("moe_load_imbalance", moe_imbalance),
                             ("moments_dtype", moments_dtype),
                             ("moe_dispatcher_sms", moe_dispatcher_sms)) if v is not None}
    if moe_host_sync_ms is not None:
        if not 0.0 <= moe_host_sync_ms <= 100.0:  # (NaN fails too)
            raise SpecError(f"--moe-host-sync-ms {moe_host_sync_ms!r}: must be between 0 and "
                            "100 (milliseconds)", field="--moe-host-sync-ms",
                            value=moe_host_sync_ms, allowed="0-100")
        moe["moe_host_sync_s"] = moe_host_sync_ms / 1e3
    try:
        return TrainingSpec(global_batch_size=global_batch, seq_len=seq_len,
                            precision=precision, flash_attention=flash_attention, **moe)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        flag = TRAINING_FLAGS.get(str(err.get("loc", ("",))[0]))
        if flag is not None:  # name the option the user typed, not the spec's field
            raise SpecError(f"{flag} {err.get('input')!r}: {err.get('msg')}", field=flag,
                            value=err.get("input")) from None
        raise from_validation_error(exc, "training") from None


def check_output_paths(*, plot: str | None = None, trace: str | None = None) -> None:
    """Reject a bad --plot (not .png/.svg/.pdf) or --trace (not .json) before any work."""
    from paraplan.export.files import check_target

    if plot is not None:
        from paraplan.viz.timeline import check_figure_path

        check_figure_path(plot, "--plot")
        check_target(plot, "--plot")
    if trace is not None and (Path(trace).suffix.lower() != ".json" or Path(trace).is_dir()):
        raise SpecError(f"--trace={trace!r} must be a file name ending in .json", field="--trace",
                        value=trace, allowed=[".json"])
    if trace is not None:
        check_target(trace, "--trace")


def read_trainer(name: str | None, export: str | None = None) -> Any:
    """The TrainerSpec of ``--trainer`` (a preset or a YAML path). Without one, ``--export X``
    implies X's trainer and otherwise the default; a trainer whose config ``X`` does not write
    is an error naming both."""
    from paraplan.specs.loaders import load_trainer

    writer = None if export in (None, "json") else _writer_of(export)
    if name is None:
        return writer or load_trainer(DEFAULT_TRAINER)
    spec = load_trainer(name)
    if export not in (None, "json") and spec.export_format != export:
        raise SpecError(f"--trainer {spec.name} conflicts with --export {export}: the {export} "
                        f"exporter writes {writer.name if writer else export}'s config; drop "
                        "--trainer or "
                        "export to json", field="--trainer", value=name)
    return spec


def _writer_of(export: str) -> Any:
    """The bundled trainer profile whose config ``--export export`` writes (None: none)."""
    from paraplan.specs.loaders import list_profiles, load_trainer

    return next((spec for spec in map(load_trainer, list_profiles("trainers"))
                 if spec.export_format == export), None)
