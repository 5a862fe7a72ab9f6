"""Predict published cases with the simulator (the glue between validate/ and simulator/)."""

from __future__ import annotations

from typing import Any

from paraplan.simulator.memory import GiB
from paraplan.simulator.step import simulate
from paraplan.validate.published import MemoryCase, PublishedCase
from paraplan.validate.report import validate_memory, validate_published


def predict_step_time(case: PublishedCase) -> tuple[float | None, str | None, bool]:
    """Simulated seconds per step. A run our memory model calls out-of-memory is still timed
    (it did run), and the disagreement is reported in the row's reason."""
    report = simulate(case.model, case.cluster, case.training, case.plan, time_if_oom=True)
    if report.step_time_s is None:
        return None, "; ".join(report.reasons), False
    note = None
    if report.reasons:
        note = "simulator memory model disagrees: " + "; ".join(report.reasons)
    return report.step_time_s, note, True


def predict_memory(case: MemoryCase) -> tuple[float | None, str | None, bool]:
    """Predicted value for a memory row, in the row's metric units (GiB or percent)."""
    report = simulate(case.model, case.cluster, case.training, case.plan, time_if_oom=True)
    if not report.memory_per_stage_gb:
        return None, "; ".join(report.reasons), False
    mem = report.memory_gb
    if case.metric == "peak_memory_gib":
        return mem["peak"], None, True
    if case.metric == "param_optimizer_memory_gib":
        return mem["weights"] + mem["grads"] + mem["optimizer"], None, True
    if case.metric == "activation_memory_gib":
        return mem["activations"], None, True
    if case.metric == "activation_memory_pct_of_tp_baseline":
        base_plan = case.plan.model_copy(update={"sequence_parallel": False,
                                                 "recompute": "none"})
        base = simulate(case.model, case.cluster, case.training, base_plan, time_if_oom=True)
        if not base.memory_gb["activations"]:
            return None, "baseline activation memory is zero", True
        return 100.0 * mem["activations"] / base.memory_gb["activations"], None, True
    return None, f"metric {case.metric} is not predicted", True


def run_published(path: str | None = None) -> dict[str, Any]:
    """``paraplan validate-published`` on a throughput CSV (default: the bundled copy)."""
    return validate_published(path, predict_step_time)


def run_memory(path: str | None = None) -> dict[str, Any]:
    """Validate peak/parameter/activation memory rows (default: the bundled copy)."""
    return validate_memory(path, predict_memory)


__all__ = ["GiB", "predict_memory", "predict_step_time", "run_memory", "run_published"]
