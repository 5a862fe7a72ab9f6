"""Published training runs as simulator cases (specs + the measured figure as step time).

``load_published_throughput`` turns every row of ``published_throughput.csv`` into a
:class:`PublishedCase` (model, cluster, training and plan specs, the measured figure converted
to seconds per optimizer step with the source's own FLOP formula); a row that cannot be
predicted keeps a plain-English ``skip_reason`` and is never dropped.
``load_published_memory`` does the same for ``published_memory.csv``. Scoring predictions
against these cases lives in :mod:`paraplan.validate.report`. Per-source formulas and facts
live in :mod:`paraplan.validate.conventions`; the CSVs and ``sources.md`` are bundled in
``data/``.

How each CSV row becomes specs (clusters, defaults, per-source rules) is in
:mod:`paraplan.validate.rows`.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paraplan.specs import (
    ClusterSpec,
    ModelSpec,
    ParallelPlan,
    SpecError,
    TrainingSpec,
)
from paraplan.specs.safe_io import MAX_TABLE_BYTES, read_user_text
from paraplan.validate.conventions import (
    RunShape,
    step_time_from_metric,
)
from paraplan.validate.row_cells import SkipRow, cell, number
from paraplan.validate.rows import row_specs

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_THROUGHPUT_CSV = DATA_DIR / "published_throughput.csv"
MOE_THROUGHPUT_CSV = DATA_DIR / "moe_throughput.csv"
"""Published MoE runs paraplan adds to the shared set (``megatron_bridge_moe``,
``megatron_bridge_moe_2608``, moe_sources.md)."""
DENSE_THROUGHPUT_CSV = DATA_DIR / "dense_throughput.csv"
"""Published dense runs paraplan adds: NVIDIA's Llama 3 recipes on DGX-GB200 and DGX-H100
(``megatron_bridge_dense``, and stas00's same-stack H200 / B200 pair ``stas00_h200_b200``;
dense_sources.md)."""
DEFAULT_MEMORY_CSV = DATA_DIR / "published_memory.csv"
MOE_MEMORY_CSV = DATA_DIR / "moe_memory.csv"
"""Measured MoE memory paraplan adds to the shared set (moe_sources.md)."""


@dataclass(frozen=True, kw_only=True)
class _Case:
    """What every published row carries: its identity and the specs built from it."""

    index: int
    source_id: str
    model_name: str
    metric: str
    measured: float
    model: ModelSpec | None
    cluster: ClusterSpec | None
    training: TrainingSpec | None
    plan: ParallelPlan | None
    skip_reason: str | None
    doubtful: bool
    framework: str
    assumptions: tuple[str, ...] = ()
    """What the loader filled in or chose for this row, in words."""
    num_gpus: int | None = None
    dp_grad_overlap: bool | None = None
    """The run overlaps DP gradient reduction with backward (its trainer's, or the row's own
    DDP implementation); ``plan.overlap_grad_reduce`` carries it to the simulator."""


@dataclass(frozen=True, kw_only=True)
class PublishedCase(_Case):
    """One published throughput row, ready for the simulator (or with a reason it is not)."""

    measured_step_time_s: float | None
    shape: RunShape | None = None
    """The row's numbers for the source's FLOP formula (to convert predictions back)."""


@dataclass(frozen=True, kw_only=True)
class MemoryCase(_Case):
    """One published memory row. ``metric`` names what was measured, in ``measured``'s units:

    ``peak_memory_gib``, ``param_optimizer_memory_gib``, ``activation_memory_gib`` (GiB per GPU)
    or ``activation_memory_pct_of_tp_baseline`` (percent of the TP-only, no-recompute activation
    memory; ``measured_gib`` is None then).
    """

    unit: str
    measured_gib: float | None
    scope: str
    measured_or_analytical: str
    is_measured: bool
    """The source says it measured the value (False: analytical or unclear)."""


def _read_rows(path: str | Path | None, default: Path) -> list[dict[str, Any]]:
    target = Path(path) if path is not None else default
    text = read_user_text(target, "published-runs", MAX_TABLE_BYTES)
    # Read over-long cells whole (bounded by the file limit) so only their own row is skipped
    # (row_cells.cell refuses them); Python's default limit would stop the whole file.
    csv.field_size_limit(max(csv.field_size_limit(), MAX_TABLE_BYTES))
    try:
        return list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise SpecError(f"published-runs file {str(target)!r} is not a readable CSV: {exc}",
                        field="path", value=str(target)) from None


# ---- throughput -------------------------------------------------------------------------------


def _measured(row: dict[str, Any], metric: str) -> float:
    text = cell(row, "measured_value")
    value = number(text, "measured_value") if text else float("nan")
    if metric == "mfu" and not text.endswith("%") and value <= 1:
        value *= 100.0  # MFU is kept in percent
    return value


def _throughput_case(index: int, row: dict[str, Any]) -> PublishedCase:
    metric = cell(row, "measured_metric")
    try:
        measured = _measured(row, metric)
    except SkipRow as exc:
        measured, bad = float("nan"), str(exc)
    else:
        bad = None
    s = row_specs(row)
    shape = None
    step = None
    if s.model is not None and s.num_gpus is not None:
        shape = RunShape(s.gbs, s.seq_len, s.num_gpus, s.model.num_layers, s.model.hidden_size,
                         s.model.vocab_size, float(s.model.num_params),
                         s.model.ffn_hidden_size, s.model.attention.k_width)
        if math.isfinite(measured):
            step, why = step_time_from_metric(s.source, metric, measured, shape)
            if step is None and s.skip is None:
                s.skip = f"measured {metric} cannot be converted to a step time: {why}"
    skip = bad or s.skip
    if skip is None and step is None:
        skip = "measured value could not be converted to a step time"
    return PublishedCase(
        index=index, source_id=s.source, model_name=cell(row, "model_name"), metric=metric,
        measured=measured, measured_step_time_s=step, model=s.model, cluster=s.cluster,
        training=s.training, plan=s.plan, skip_reason=skip, doubtful=s.doubt,
        framework=s.framework, assumptions=tuple(s.notes), num_gpus=s.num_gpus,
        dp_grad_overlap=s.overlap, shape=shape,
    )


def load_published_throughput(path: str | Path | None = None) -> list[PublishedCase]:
    """One case per row of ``published_throughput.csv`` (bundled copy when ``path`` is None,
    followed by paraplan's own additions: ``moe_throughput.csv`` (MoE runs, moe_sources.md)
    and ``dense_throughput.csv`` (dense Blackwell and Hopper runs, dense_sources.md))."""
    rows = _read_rows(path, DEFAULT_THROUGHPUT_CSV)
    if path is None:
        rows += _read_rows(MOE_THROUGHPUT_CSV, MOE_THROUGHPUT_CSV)
        rows += _read_rows(DENSE_THROUGHPUT_CSV, DENSE_THROUGHPUT_CSV)
    return [_throughput_case(i, row) for i, row in enumerate(rows)]


# ---- memory -----------------------------------------------------------------------------------

METRIC_PCT = "activation_memory_pct_of_tp_baseline"
_GIB_PER_UNIT = {"gib": 1.0, "gb": 1e9 / 2**30, "mib": 1 / 1024, "mb": 1e6 / 2**30}


def _memory_metric(scope: str, unit: str) -> str:
    low = scope.lower()
    if "percent" in unit.lower() or "relative" in low:
        return METRIC_PCT
    if low.startswith("parameters") or "optimizer" in low:
        return "param_optimizer_memory_gib"
    if low.startswith("activation"):
        return "activation_memory_gib"
    return "peak_memory_gib"


def _memory_case(index: int, row: dict[str, Any]) -> MemoryCase:
    unit, scope = cell(row, "unit"), cell(row, "memory_scope")
    metric = _memory_metric(scope, unit)
    s = row_specs(row, memory=True)
    skip = s.skip
    try:
        measured = number(cell(row, "measured_value"), "measured_value")
    except SkipRow as exc:
        measured, skip = float("nan"), str(exc)
    if skip is None and not measured > 0:
        skip = f"measured value {measured!r} is not positive"
    factor = _GIB_PER_UNIT.get(unit.lower())
    gib = measured * factor if factor is not None and metric != METRIC_PCT else None
    if gib is None and metric != METRIC_PCT and skip is None:
        skip = f"memory unit {unit!r} is not understood"
    flag = cell(row, "measured_or_analytical")
    return MemoryCase(
        index=index, source_id=s.source, model_name=cell(row, "model_name"), metric=metric,
        measured=measured, unit=unit, measured_gib=gib, scope=scope,
        measured_or_analytical=flag, is_measured=flag.lower() == "measured", model=s.model,
        cluster=s.cluster, training=s.training, plan=s.plan, skip_reason=skip,
        doubtful=s.doubt, framework=s.framework, assumptions=tuple(s.notes),
        num_gpus=s.num_gpus, dp_grad_overlap=s.overlap,
    )


def load_published_memory(path: str | Path | None = None) -> list[MemoryCase]:
    """One case per row of ``published_memory.csv`` (bundled copy when ``path`` is None,
    followed by paraplan's own additions in ``moe_memory.csv``)."""
    rows = _read_rows(path, DEFAULT_MEMORY_CSV)
    if path is None:
        rows += _read_rows(MOE_MEMORY_CSV, MOE_MEMORY_CSV)
    return [_memory_case(i, row) for i, row in enumerate(rows)]


# ---- validation -------------------------------------------------------------------------------
