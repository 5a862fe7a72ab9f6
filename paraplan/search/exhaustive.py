"""Exhaustive search: rank every legal plan of the space; the default on homogeneous clusters.

The whole space is evaluated at once by ``space.evaluate_space``; the finalists are then run
through ``simulate()`` so the reported numbers are the simulator's own. Plans whose vectorized
step time is only a lower bound (interleaved with m % pp != 0) are simulated lazily, in order
of their bound, until no bound can beat the K-th best exact time, so the top K are exact
(Fagin-style threshold stopping). Uneven layer splits carry the closed-form estimate of the
mean stage (``simulate`` runs the event simulation for them); they are re-simulated when they
reach the finalists. When the model's layers differ in cost (``uneven_layer_costs``) the
``RESPLITS`` fastest pipelined plans, and the fastest of each of ``RESPLIT_SHAPES`` more
parallel shapes, are also re-split by the exact layer-partition DP
(``dp.resplit``), as the dp searcher does for more of them. Times in seconds.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from paraplan.search.moe_runs import report_run
from paraplan.search.space import (
    PlanSpace,
    SpaceOptions,
    build_space,
    evaluate_space,
)
from paraplan.search.space.keys import plan_key
from paraplan.simulator.step import STEP_PARTS, StepReport, simulate
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import TrainerSpec
from paraplan.specs.training import TrainingSpec

if TYPE_CHECKING:
    import pandas as pd

TIME_PARTS = (*STEP_PARTS, "exposed_comm")
"""Time parts of a report (``StepReport.time_s`` keys), in ``SearchResult.to_frame`` order."""

Progress = Callable[[int, int], None]


@dataclass
class SearchResult:
    """What every searcher returns (``to_dict`` is the ``paraplan best`` JSON contract)."""

    searcher: str
    plans_evaluated: int
    search_time_s: float
    reports: list[StepReport]
    baseline_step_time_s: float | None
    rejected: dict[str, int] = field(default_factory=dict)
    """Plans rejected by reason (rule broken, or out of memory on the worst stage)."""
    considered: int = 0
    """Plans in the raw grid before rules and memory."""
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> StepReport | None:
        return self.reports[0] if self.reports else None

    def to_frame(self) -> pd.DataFrame:
        """The ranked plans as a pandas DataFrame, one row per plan in rank order.

        Columns: ``rank`` (1 = best), ``plan`` (the short string, e.g. ``tp=2 pp=4 dp=16
        zero=2 mbs=1 zb-h1``), every ``ParallelPlan`` field (``tp``, ``pp``, ``dp``, ``cp``,
        ``ep``, ``zero_stage``, ``micro_batch_size``, ``schedule``, ``recompute``, ...;
        ``layers_per_stage`` as ``"19/21/21/19"`` or None, ``placement`` replaced by the bool
        ``placed``), ``moe_run`` (MoE models: the dispatcher and overlap the plan was ranked
        under, e.g. ``deepep + a2a-overlap``, as ``search()`` records it; None for dense
        ones and for the bare searchers), ``num_microbatches``,
        ``feasible``, ``step_time_s`` (s),
        ``tokens_per_s`` (cluster), ``mfu``, ``hfu`` (fractions), ``model_tflops_per_gpu``,
        ``memory_peak_gb`` and ``memory_headroom_gb`` (GiB, worst rank) and one column per
        time part of the critical stage in seconds: ``compute_s``, ``bubble_s``,
        ``tp_comm_s``, ``cp_comm_s``, ``ep_comm_s``, ``pp_comm_s``, ``dp_comm_s``,
        ``optimizer_s``, ``exposed_comm_s``. Values are those of ``to_dict()["plans"]``.
        """
        import pandas as pd

        plan_fields = [f for f in ParallelPlan.model_fields if f != "placement"]
        time_cols = [f"{part}_s" for part in TIME_PARTS]
        columns = (["rank", "plan", *plan_fields, "placed", "moe_run", "num_microbatches",
                    "feasible",
                    "step_time_s", "tokens_per_s", "mfu", "hfu", "model_tflops_per_gpu",
                    "memory_peak_gb", "memory_headroom_gb", *time_cols])
        rows = []
        for rank, report in enumerate(self.reports, start=1):
            plan = report.plan
            row: dict[str, Any] = {"rank": rank,
                                   "plan": report.extra.get("plan_short", "")}
            for f in plan_fields:
                value = plan.get(f)
                if isinstance(value, list | tuple):
                    value = "/".join(str(x) for x in value)
                row[f] = value
            if row.get("dp") is None:
                row["dp"] = report.extra.get("dp")
            row.update(
                placed=plan.get("placement") is not None,
                moe_run=report_run(report),
                num_microbatches=report.extra.get("num_microbatches"),
                feasible=report.feasible, step_time_s=report.step_time_s,
                tokens_per_s=report.tokens_per_s, mfu=report.mfu, hfu=report.hfu,
                model_tflops_per_gpu=report.model_tflops_per_gpu,
                memory_peak_gb=report.memory_gb.get("peak"),
                memory_headroom_gb=report.extra.get("memory_headroom_gb"))
            row.update({f"{part}_s": report.time_s.get(part, 0.0) for part in TIME_PARTS})
            rows.append(row)
        return pd.DataFrame(rows, columns=columns)

    def to_dict(self) -> dict[str, Any]:
        return {
            "searcher": self.searcher,
            "plans_evaluated": self.plans_evaluated,
            "search_time_s": self.search_time_s,
            "plans": [r.to_dict() for r in self.reports],
            "baseline_step_time_s": self.baseline_step_time_s,
            "considered": self.considered,
            "rejected": dict(sorted(self.rejected.items(), key=lambda kv: -kv[1])),
            "notes": self.notes,
            **self.extra,
        }


def oom_reasons(space: PlanSpace, peak_gib: np.ndarray, worst: np.ndarray,
                capacity_gib: float) -> Counter:
    """Count plans that do not fit, by the stage that overflows first."""
    out: Counter = Counter()
    over = peak_gib > capacity_gib
    if over.any():
        stages, counts = np.unique(worst[over], return_counts=True)
        for s, k in zip(stages.tolist(), counts.tolist(), strict=True):
            out[f"out of memory on stage {s}"] += k
    return out


RESPLITS = 4
"""Pipelined finalists the exhaustive searcher re-splits when layers differ in cost."""
RESPLIT_SHAPES = 4
"""And the fastest plan of each of this many more pipelined parallel shapes, beyond those of
the ``RESPLITS`` plans (``resplit_finalists``)."""


def uneven_layer_costs(model: ModelSpec) -> bool:
    """Whether the model's layers differ in cost enough that where the stage boundaries fall
    matters beyond the LM head: MoE models with leading dense layers, dense layers between
    MoE ones, or a multi-token-prediction module (priced on the last stage)."""
    return bool(model.num_mtp_layers or (model.is_moe and (
        model.first_dense_layers or model.moe_layer_step > 1)))


def top_k(step: np.ndarray, lower: np.ndarray, feasible: np.ndarray, k: int,
          simulate_row: Callable[[int], StepReport], cutoff: float | None = None
          ) -> list[StepReport]:
    """The K fastest feasible plans as exact StepReports.

    ``lower`` bounds each row's exact step time from below (``Evaluation.lower_s``: the
    step time itself where ``step`` is exact). Rows are simulated in order of ``lower``
    until a row's bound reaches the K-th best exact time found, so no row that could beat it
    is skipped. ``cutoff``: a K-th best exact time already known from elsewhere (another MoE
    run setting's search), which the rows must beat as well: fewer than K reports may
    return. ``step`` (the estimates) breaks ties in the visiting order.
    """
    rows = np.nonzero(feasible & np.isfinite(step) & np.isfinite(lower))[0]
    order = rows[np.lexsort((step[rows], lower[rows]))]
    heap: list[tuple[float, int, StepReport]] = []  # max-heap on time via negation
    for i in order.tolist():
        kth = -heap[0][0] if len(heap) >= k else None
        if cutoff is not None:
            kth = cutoff if kth is None else min(kth, cutoff)
        if kth is not None and lower[i] >= kth:
            break
        rep = simulate_row(i)
        if not rep.feasible or rep.step_time_s is None:
            continue
        item = (-rep.step_time_s, -i, rep)
        if len(heap) < k:
            heapq.heappush(heap, item)
        elif rep.step_time_s < -heap[0][0]:
            heapq.heapreplace(heap, item)
    return sorted((r for _, _, r in heap), key=rank_key)


def rank_key(report: StepReport) -> tuple[float, float, int]:
    """Order of equally fast plans: step time (to 1e-9 relative), then less memory, then
    fewer model-parallel GPUs (simpler to run)."""
    plan = report.plan
    return (float(f"{report.step_time_s:.9e}"), round(report.memory_gb["peak"], 6),
            plan["tp"] * plan["pp"] * plan["cp"] * plan["ep"])


def exhaustive_search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
                      fix: dict[str, Any] | None = None, top: int = 10,
                      options: SpaceOptions | None = None,
                      progress: Progress | None = None,
                      trainer: TrainerSpec | None = None,
                      space: PlanSpace | None = None,
                      cutoff: float | None = None) -> SearchResult:
    """Rank every legal plan; return the ``top`` fastest that fit, as exact StepReports.
    With a ``trainer``, only plans it can express, priced as it runs them. For models whose
    layers differ in cost, the ``RESPLITS`` fastest pipelined plans (and shapes) are re-split by the
    layer-partition DP too (plans below them keep their near-even split). ``space``: the
    plans already built for these arguments (``build_space`` / ``derive_space``).
    ``cutoff``: the ``top``-th best step time other searches of the same job already found
    (``search`` under several MoE run settings): only plans that can beat it are simulated,
    so fewer than ``top`` may return.

    Raises:
        SpecError: when no plan is legal or none fits in memory (the message says why).
    """
    if top < 1:
        raise SpecError("top must be >= 1", field="top", value=top)
    start = time.perf_counter()
    if space is None:
        space = build_space(model, cluster, training, fix, options, trainer)
    if len(space) == 0:
        reasons = ", ".join(f"{n:,} {r}" for r, n in space.rejected.most_common(3))
        raise SpecError(f"no legal plan for {model.name} on {cluster.num_gpus} GPUs of "
                        f"{cluster.name} with global batch {training.global_batch_size}"
                        + (f" ({reasons})" if reasons else ""), field="plan",
                        value=str(fix or {}))
    ev = evaluate_space(space, progress, exact_interleaved=False, top=top, cutoff=cutoff,
                        breakdown=False)
    rejected = Counter(space.rejected)
    rejected.update(oom_reasons(space, ev.peak_gib, ev.worst_stage, ev.capacity_gib))
    feasible = ev.feasible
    if not feasible.any():
        best = int(np.argmin(ev.peak_gib))
        plan = space.plan(best)
        raise SpecError(
            f"no plan fits in memory: the smallest footprint ({plan.short()}) needs "
            f"{ev.peak_gib[best]:.1f} GiB per GPU of {ev.capacity_gib:g} GiB; add GPUs, use "
            "a GPU with more memory or a shorter sequence", field="memory",
            value=round(float(ev.peak_gib[best]), 1))

    def sim(i: int) -> StepReport:
        return simulate(model, cluster, training, space.plan(i), trainer=trainer)

    reports = top_k(ev.step_time_s, ev.lower_s, feasible, top, sim, cutoff)
    notes = []
    resplit = 0
    if uneven_layer_costs(model):
        # Layers of unequal cost (leading dense layers, an MTP module beside the LM head on
        # the last stage): the near-even split loads the wrong stages, so the fastest
        # pipelined plans get the exact layer-partition DP (the dp searcher runs it on 48).
        from paraplan.search.dp.resplit import resplit_finalists

        seen = {plan_key(r) for r in reports}
        more, resplit = resplit_finalists(space, ev, RESPLITS, trainer, seen,
                                          shapes=RESPLIT_SHAPES)
        reports = sorted(reports + more, key=rank_key)[:top]
        if resplit:
            notes.append(f"{resplit} pipelined plans re-split by the exact layer-partition DP "
                         "(layers of unequal cost)")
    elapsed = time.perf_counter() - start
    if (~ev.exact & feasible & np.isfinite(ev.step_time_s)).any():  # (not the pruned rows)
        notes.append("interleaved plans with m % pp != 0 and uneven layer splits were ranked "
                     "by a bound/estimate and simulated exactly when they could reach the top")
    return SearchResult(
        searcher="exhaustive", plans_evaluated=len(space) + resplit, search_time_s=elapsed,
        reports=reports,
        # Rank-order placement is what this searcher evaluates, so the baseline is its best.
        baseline_step_time_s=reports[0].step_time_s if reports else None,
        rejected=dict(rejected), considered=space.considered, notes=notes,
        extra={"feasible_plans": int(feasible.sum()),
               **({"resplit_plans": resplit} if resplit else {})},
    )
