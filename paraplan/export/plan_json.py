"""The paraplan plan JSON: a plan with its model, run, world and every derived quantity, in
one self-contained file that loads back (``read_plan_document``) and that every trainer
exporter can be run from (``paraplan export plan.json --to megatron``).

Layout (``format = "paraplan-plan/1"``): ``model`` (ModelSpec fields), ``training``
(TrainingSpec fields), ``cluster`` (name, or null), ``world_size``, ``plan`` (ParallelPlan
fields, dp resolved), ``derived`` (``ExportContext.derived``: dp, micro-batches, layers per
chunk and per pipeline rank, rank order, ...), and optionally ``prediction`` (the
simulator's step time, throughput, MFU and peak memory for this plan) and ``search`` (the
``paraplan best`` result the plan came from).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from paraplan.export.common import ExportContext, ExportError
from paraplan.specs.errors import from_validation_error
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

PLAN_FORMAT = "paraplan-plan/1"


def plan_document(ctx: ExportContext, *, report: dict[str, Any] | None = None,
                  search: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan JSON of ``ctx`` (JSON-ready). ``report``: a StepReport dict of this plan, whose
    headline numbers go under ``prediction``; ``search``: a ``best`` result to keep."""
    from paraplan.version import __version__

    doc: dict[str, Any] = {
        "format": PLAN_FORMAT,
        "paraplan_version": __version__,
        "model": ctx.model.model_dump(mode="json", exclude_none=True),
        "training": ctx.training.model_dump(mode="json", exclude_none=True),
        "cluster": ctx.cluster_name,
        "world_size": ctx.world_size,
        "plan": ctx.plan.model_dump(mode="json", exclude_none=True),
        "derived": ctx.derived(),
    }
    if report is not None:
        doc["prediction"] = {k: report.get(k) for k in
                             ("feasible", "step_time_s", "tokens_per_s", "mfu",
                              "model_tflops_per_gpu")}
        doc["prediction"]["memory_peak_gb"] = (report.get("memory_gb") or {}).get("peak")
        doc["prediction"]["time_s"] = report.get("time_s")
    if search is not None:
        doc["search"] = search
    return doc


def is_plan_document(data: Any) -> bool:
    """Whether ``data`` is a paraplan plan JSON (any version of the format)."""
    return isinstance(data, dict) and str(data.get("format", "")).startswith("paraplan-plan/")


def read_plan_document(data: dict[str, Any]) -> ExportContext:
    """Load a plan JSON back into an ``ExportContext`` (model, run, plan and world size).

    Raises:
        ExportError: not a plan JSON of a known format version, or a field is invalid (the
            message names it).
    """
    if not is_plan_document(data):
        raise ExportError("not a paraplan plan JSON (it needs \"format\": "
                          f"\"{PLAN_FORMAT}\")", field="format",
                          value=data.get("format") if isinstance(data, dict) else None,
                          allowed=[PLAN_FORMAT])
    if data["format"] != PLAN_FORMAT:
        raise ExportError(f"plan JSON format {data['format']!r} is not supported",
                          field="format", value=data["format"], allowed=[PLAN_FORMAT])
    for key in ("model", "training", "plan", "world_size"):
        if key not in data:
            raise ExportError(f"plan JSON has no {key!r}", field=key)
        if key != "world_size" and not isinstance(data[key], dict):
            raise ExportError(f"plan JSON {key} must be an object (a mapping of keys), not "
                              f"{type(data[key]).__name__}", field=key,
                              value=type(data[key]).__name__)
    try:
        model = ModelSpec(**data["model"])
    except (ValidationError, TypeError) as exc:
        raise _invalid(exc, "model") from None
    try:
        training = TrainingSpec(**data["training"])
    except (ValidationError, TypeError) as exc:
        raise _invalid(exc, "training") from None
    try:
        plan = ParallelPlan(**data["plan"])
    except (ValidationError, TypeError) as exc:
        raise _invalid(exc, "plan") from None
    world = data["world_size"]
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ExportError(f"world_size={world!r} must be a positive integer",
                          field="world_size", value=world)
    from paraplan.export.common import export_context

    ctx = export_context(model, training, plan, world_size=world)
    return ExportContext(ctx.model, ctx.training, ctx.plan, ctx.world_size,
                         data.get("cluster"))


def _invalid(exc: Exception, where: str) -> ExportError:
    if isinstance(exc, ValidationError):
        err = from_validation_error(exc, where)
        return ExportError(str(err), field=err.field, value=err.value)
    return ExportError(f"plan JSON {where}: {exc}", field=where)
