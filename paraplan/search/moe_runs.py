"""The MoE run settings a search ranks plans under (``moe_runs``), and how a searched plan
carries the one it was priced with: ``run_training`` (the TrainingSpec to simulate or export it
with) and ``run_label`` / ``report_run`` (in words). Used by ``search``, ``pareto_front``,
``validate-recipes`` and the frames and CLI that show plans."""

from __future__ import annotations

from typing import Any

from paraplan.simulator.report import StepReport
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import TrainerSpec, a2a_overlap_needs
from paraplan.specs.training import TrainingSpec

MOE_RUN_FIELDS = ("moe_dispatcher", "moe_a2a_overlap")
"""Training fields of an MoE run that a search chooses per plan (``moe_runs``), unless set."""


def moe_runs(model: ModelSpec, training: TrainingSpec, trainer: TrainerSpec | None,
             pins: dict[str, Any], chosen: set[str] | None = None) -> list[TrainingSpec]:
    """The MoE run settings a search ranks plans under: every token dispatcher the trainer
    has (``can.moe_dispatchers``), each with and without the expert-parallel all-to-all
    overlap where it has that (``can.moe_a2a_overlap``): the trainer's own dispatcher first,
    and without the overlap first (the setting that also ranks plans without expert
    parallelism).
    A field the user set (``chosen``, default ``training.model_fields_set``: the
    ``--moe-dispatcher``, ``--moe-a2a-overlap`` options) stays as set; DeepEP is
    left out when ``--fix`` pins a capacity factor (it drops no tokens). Dense models, and
    searches without a trainer (the plan fields' defaults), get ``[training]``.

    Both knobs are priced (``simulator.layer.layer_parts``: DeepEP's deduplicated,
    NVLink-forwarded sends; the overlap hides the all-to-alls under the other micro-batch's
    compute and takes the communication kernels' SMs from it) and each has the trainer's
    rules (``trainer_reasons``), so a plan that needs one is ranked with its cost, not left
    out of reach because the profile's exported default does not use it."""
    if not model.is_moe or trainer is None:
        return [training]
    can = trainer.can
    chosen = training.model_fields_set if chosen is None else chosen
    dispatchers = ([training.moe_dispatcher] if "moe_dispatcher" in chosen
                   else list(dict.fromkeys([training.moe_dispatcher, *can.moe_dispatchers])))
    if pins.get("moe_capacity_factor") is not None and "moe_dispatcher" not in chosen:
        dispatchers = [d for d in dispatchers if d != "hierarchical"] or dispatchers
    # The overlap's run-level conditions (16-bit weights, at most one MTP layer) hold for
    # every plan or none: without them there is no overlapped setting to rank.
    overlap_ok = can.moe_a2a_overlap and not a2a_overlap_needs(model, training, ParallelPlan())
    # Unless set, the setting without the overlap comes first: plans without expert
    # parallelism (which the overlap's rules refuse) are ranked under the first setting only.
    overlaps = ([training.moe_a2a_overlap] if "moe_a2a_overlap" in chosen or not overlap_ok
                else [False, True])
    return [training.model_copy(update={"moe_dispatcher": d, "moe_a2a_overlap": o})
            for d in dispatchers for o in overlaps]


def run_fields(run: TrainingSpec) -> dict[str, Any]:
    """The MoE run setting of ``run`` as the fields a report's ``extra`` (and a TrainingSpec
    update) carries: ``moe_dispatcher``, ``moe_a2a_overlap``."""
    return {k: getattr(run, k) for k in MOE_RUN_FIELDS}


def run_training(training: TrainingSpec, report: StepReport) -> TrainingSpec:
    """``training`` with the MoE run settings a searched plan was ranked under (its
    ``moe_dispatcher`` / ``moe_a2a_overlap`` extras): what simulating or exporting that plan
    needs to price it as ranked."""
    update = {k: report.extra[k] for k in MOE_RUN_FIELDS if k in report.extra}
    return training.model_copy(update=update) if update else training


def report_run(report: StepReport) -> str | None:
    """The MoE run setting a searched plan was ranked under, in words (``run_label``); None
    for dense models (nothing to choose)."""
    return run_label(report.extra) if "moe_dispatcher" in report.extra else None


def run_label(run: TrainingSpec | dict[str, Any]) -> str:
    """An MoE run setting (a TrainingSpec, or a report's extras) in words: ``alltoall``,
    ``deepep``, ``+ a2a-overlap``."""
    get = run.get if isinstance(run, dict) else lambda k: getattr(run, k)
    name = "deepep" if get("moe_dispatcher") == "hierarchical" else "alltoall"
    return name + (" + a2a-overlap" if get("moe_a2a_overlap") else "")
