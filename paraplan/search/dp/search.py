"""``best --searcher dp``: the exhaustive ranking, then the optimal layer split and per-layer
recompute of the finalists."""

from __future__ import annotations

from typing import Any

import numpy as np

from paraplan.search.dp.resplit import finalist_rows, fitting, resplit_finalists
from paraplan.search.exhaustive import Progress, SearchResult
from paraplan.search.space import PlanSpace, SpaceOptions
from paraplan.search.space.keys import plan_key
from paraplan.simulator.step import StepReport
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.trainer import TrainerSpec
from paraplan.specs.training import TrainingSpec

SHAPES = 16
"""Besides its ``candidates`` fastest pipelined plans, the dp searcher re-splits the fastest
plan of this many more parallel shapes (``resplit.finalist_rows``): without them,
DeepSeek-V3 on 2,048 H800 came out 37.03 s against the exhaustive 33.28 s (a 16-stage
re-split whose even split ranked below 48 variants of other shapes). The exhaustive
searcher's own re-split rows are added as well, so its best is never slower."""


def dp_search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
              fix: dict[str, Any] | None = None, top: int = 10,
              options: SpaceOptions | None = None, progress: Progress | None = None,
              candidates: int = 48, trainer: TrainerSpec | None = None,
              space: PlanSpace | None = None) -> SearchResult:
    """Exhaustive ranking, then the exact layer-split DP on the best pipelined plans.

    The vectorized evaluator ranks every plan (even or near-even splits, timed even when they
    do not fit); the ``candidates`` fastest non-interleaved pipelined plans whose even split
    needs at most 25% more memory than the GPU has, and the fastest plan of each of ``SHAPES``
    more parallel shapes, are re-split by :func:`optimal_layer_split` (a rebalanced split can
    fit where the even one does not) and simulated, together with the rows the exhaustive
    searcher re-splits. The result holds the best ``top`` of those and of the exhaustive top, by
    ``simulate()`` step time, so it is never slower than the exhaustive searcher's best.
    With a ``trainer``, only plans it can express (no re-split where it splits layers evenly).
    ``space``: the plans already built for these arguments (``build_space`` / ``derive_space``).
    """
    import time

    from paraplan.search.exhaustive import (
        RESPLIT_SHAPES,
        RESPLITS,
        oom_reasons,
        rank_key,
        top_k,
    )
    from paraplan.search.space import build_space, evaluate_space
    from paraplan.simulator.step import simulate

    start = time.perf_counter()
    if space is None:
        space = build_space(model, cluster, training, fix, options, trainer)
    if len(space) == 0:
        raise SpecError(f"no legal plan for {model.name} on {cluster.num_gpus} GPUs",
                        field="plan", value=str(fix or {}))
    ev = evaluate_space(space, progress, exact_interleaved=False, times_for_oom=True)
    feasible = ev.feasible

    def sim(i: int) -> StepReport:
        return simulate(model, cluster, training, space.plan(i), trainer=trainer)

    reports = top_k(ev.step_time_s, ev.lower_s, feasible, top, sim) if feasible.any() else []
    # And every row the exhaustive searcher re-splits: this evaluation also times plans whose
    # even split does not fit, which the exhaustive one leaves out, so its finalists are not
    # necessarily among these (DeepSeek-V3 on 256 H800: 43.85 s against 40.99 s without).
    theirs = finalist_rows(space, fitting(ev), RESPLITS, RESPLIT_SHAPES)
    more, resplit = resplit_finalists(space, ev, candidates, trainer,
                                      {plan_key(r) for r in reports}, shapes=SHAPES,
                                      extra_rows=theirs)
    reports += more
    if not reports:
        raise SpecError("no plan fits in memory, even with the layer split rebalanced",
                        field="memory", value=round(float(np.min(ev.peak_gib)), 1))
    reports = sorted(reports, key=rank_key)[:top]
    rejected = dict(space.rejected)
    for k, v in oom_reasons(space, ev.peak_gib, ev.worst_stage, ev.capacity_gib).items():
        rejected[k] = rejected.get(k, 0) + v
    return SearchResult(
        searcher="dp", plans_evaluated=len(space) + resplit,
        search_time_s=time.perf_counter() - start, reports=reports,
        baseline_step_time_s=min((r.step_time_s for r in reports
                                  if r.plan.get("layers_per_stage") is None),
                                 default=reports[0].step_time_s),
        rejected=rejected, considered=space.considered,
        notes=[f"{resplit} pipelined plans re-split by the exact layer-partition DP; baseline "
               "is the best even split"],
        extra={"feasible_plans": int(feasible.sum()), "resplit_plans": resplit},
    )
