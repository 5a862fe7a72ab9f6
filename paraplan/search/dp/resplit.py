"""Re-split the fastest pipelined plans of an evaluated space with the exact layer-partition
DP (:func:`optimal_layer_split`): the exhaustive searcher does it for 4 finalists and the
fastest plan of each of 4 more parallel shapes when the model's layers differ in cost; the dp
searcher for 48 and 16 more shapes, and for every row the exhaustive searcher would take
(``fitting``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from paraplan.search.dp.layer_split import optimal_layer_split
from paraplan.search.space import Evaluation, PlanSpace
from paraplan.search.space.keys import key_index, plan_key
from paraplan.simulator.step import StepReport, even_split, simulate
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import TrainerSpec
from paraplan.specs.training import TrainingSpec


def resplit_finalists(space: PlanSpace, ev: Evaluation, candidates: int,
                      trainer: TrainerSpec | None, seen: set[str], *, shapes: int = 0,
                      extra_rows: np.ndarray | None = None
                      ) -> tuple[list[StepReport], int]:
    """The ``candidates`` fastest non-interleaved pipelined plans of an evaluated space whose
    even split needs at most 25% more memory than the GPU has, plus the fastest plan of each
    of the ``shapes`` fastest parallel shapes (tp, pp, cp, ep, etp, sequence parallelism,
    schedule) those rows do not already cover, re-split by :func:`optimal_layer_split` and
    simulated: (the feasible reports whose plan is not in ``seen``, how many plans were
    re-split). None where the trainer splits layers evenly.

    The shapes: the even split ranks a shape by how badly it fits the costly layers, not by
    what its re-split reaches (a 16-stage pipeline whose last stage also holds the MTP
    module and the LM head runs far behind its re-split), so the fastest rows alone can all
    be variants (ZeRO stage, micro-batch, recompute) of the few shapes the even split suits.
    ``extra_rows``: more rows to re-split (after these, without repeats)."""
    model, cluster, training = space.model, space.cluster, space.training
    rows = finalist_rows(space, ev, candidates, shapes)
    if extra_rows is not None and len(extra_rows):
        rows = np.concatenate([rows, extra_rows[~np.isin(extra_rows, rows)]])
    if trainer is not None and not trainer.can.uneven_layers:
        rows = rows[:0]
    out: list[StepReport] = []
    resplit = 0
    for i in rows.tolist():
        plan = space.plan(i)
        split = best_split(model, cluster, training, plan)
        if split is None:
            continue
        resplit += 1
        if list(split.layers_per_stage or []) == even_split(model.num_layers, plan.pp):
            continue  # the split the plan already has (its report is the exhaustive one)
        rep = simulate(model, cluster, training, split, trainer=trainer)
        key = plan_key(rep)
        if rep.feasible and key not in seen:
            seen.add(key)
            out.append(rep)
    return out, resplit


def finalist_rows(space: PlanSpace, ev: Evaluation, candidates: int, shapes: int = 0
                  ) -> np.ndarray:
    """Rows of ``space`` that :func:`resplit_finalists` re-splits: the ``candidates`` fastest
    non-interleaved pipelined plans whose even split needs at most 25% more memory than the
    GPU has, then the fastest row of each of the ``shapes`` fastest parallel shapes those
    rows do not cover.

    Monotone in both counts: a shape with any row among the fastest ``candidates`` has its
    fastest row there too (rows are taken in time order), and the fastest shapes outside a
    larger set of rows are at most as many places down as outside a smaller one. So more
    candidates with at least as many shapes pick a superset of the rows of the same
    evaluation. (The dp searcher's evaluation also times plans whose even split does not fit,
    which the exhaustive searcher's leaves out, so it adds the exhaustive searcher's rows
    explicitly: ``fitting``.)"""
    c = space.cols
    pipelined = (c["pp"] > 1) & (c["v"] == 1) & (ev.peak_gib <= 1.25 * ev.capacity_gib)
    rows = np.nonzero(pipelined & np.isfinite(ev.step_time_s))[0]
    rows = rows[np.argsort(ev.step_time_s[rows], kind="stable")]
    picked = rows[:candidates]
    if shapes and len(rows):
        _, code = key_index([c[k][rows] for k in ("tp", "pp", "cp", "ep", "etp", "sp",
                                                      "sched")])
        _, first = np.unique(code, return_index=True)  # each shape's fastest row
        first = np.sort(first)  # fastest shapes first
        new = first[~np.isin(code[first], code[:len(picked)])][:shapes]
        picked = np.concatenate([picked, rows[new]])
    return picked


def fitting(ev: Evaluation) -> Evaluation:
    """``ev`` with no step time where the plan does not fit in memory: what the exhaustive
    searcher's evaluation (``times_for_oom=False``) holds, from one that timed every plan."""
    return replace(ev, step_time_s=np.where(ev.feasible, ev.step_time_s, np.nan))


def best_split(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
               plan: ParallelPlan) -> ParallelPlan | None:
    """``plan`` with the layer split :func:`optimal_layer_split` finds for it (whatever split
    it had), or None where the DP finds none."""
    try:
        return optimal_layer_split(model, cluster, training,
                                   plan.model_copy(update={"layers_per_stage": None})).plan
    except SpecError:
        return None
