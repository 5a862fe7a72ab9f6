"""The slowest-type baseline and the best-first ILP search over structural choices."""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from typing import Any

from paraplan.search.ilp.bounds import data_bound, pipeline_bound
from paraplan.search.ilp.choices import (
    MAX_MICRO_BATCH,
    enumerate_choices,
    normalise_fix,
    pick,
    recomputes,
    tp_ok,
    zero_stages,
)
from paraplan.search.ilp.context import Ctx, layer_costs, make_context, stage_time
from paraplan.search.ilp.data_ilp import data_inputs, solve_data
from paraplan.search.ilp.pipeline_ilp import pipeline_solution, run_pipeline_ilp
from paraplan.search.ilp.pipeline_inputs import build_pipeline_inputs
from paraplan.search.ilp.results import FORMULATIONS, IlpCandidate, IlpResult, SolveRecord
from paraplan.search.space import CONSTANT_FIELDS
from paraplan.simulator.step import even_split, simulate
from paraplan.specs.checks import check_plan, divisors
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import TrainerSpec, trainer_reasons
from paraplan.specs.training import TrainingSpec


def _key(plan: ParallelPlan) -> tuple:
    """What tells two re-timed plans of one ILP answer apart."""
    return plan.schedule, tuple(plan.layers_per_stage or ())


def _adjacent_swaps(plan: ParallelPlan, stage_types: list[str]) -> list[list[int]]:
    """``plan``'s layer split with each pair of adjacent stages of one GPU type and unequal
    layer counts swapped (the same ILP objective)."""
    layers = list(plan.layers_per_stage or ())
    out = []
    for k in range(len(layers) - 1):
        if stage_types[k] == stage_types[k + 1] and layers[k] != layers[k + 1]:
            swapped = layers.copy()
            swapped[k], swapped[k + 1] = swapped[k + 1], swapped[k]
            out.append(swapped)
    return out


def _baseline(ctx: Ctx, fix: dict[str, Any], trainer: TrainerSpec | None = None
              ) -> tuple[float | None, ParallelPlan | None]:
    """Best even-split plan on the original rank order (``simulate``; every stage paced by
    its slowest GPU and capped by its smallest memory) that ``trainer`` can run, pruned by
    its exact compute bottleneck m * max_r t_r, seconds."""
    model, training, cluster = ctx.model, ctx.training, ctx.cluster
    n, L, B = cluster.num_gpus, model.num_layers, training.global_batch_size
    groups = cluster.topology.group_of_gpu
    first = cluster.node_groups[0].gpu.name
    gpn = min(g.gpus_per_node for g in cluster.node_groups)
    extra = tuple((k, fix[k]) for k in ("ep", "etp") if fix.get(k) is not None)
    todo: list[tuple[float, ParallelPlan]] = []
    for tp in [t for t in pick(fix, "tp", divisors(gpn)) if tp_ok(model, t)]:
        for cp in pick(fix, "cp", [1]):
            for pp in pick(fix, "pp", [p for p in divisors(n) if p <= L]):
                if n % (tp * pp * cp):
                    continue
                dp = n // (tp * pp * cp)
                if fix.get("dp") is not None and fix["dp"] != dp:
                    continue
                span = dp * tp * cp
                stage_types = [{cluster.node_groups[int(g)].gpu.name
                                for g in set(groups[r * span:(r + 1) * span].tolist())}
                               for r in range(pp)]
                layers = even_split(L, pp)
                for sp in pick(fix, "sequence_parallel", [tp > 1]):
                    if sp and tp == 1:
                        continue
                    for mbs in pick(fix, "micro_batch_size",
                                    [b for b in divisors(B) if b <= MAX_MICRO_BATCH]):
                        if B % (dp * mbs):
                            continue
                        m = B // (dp * mbs)
                        base = ParallelPlan(tp=tp, cp=cp, sequence_parallel=sp,
                                            micro_batch_size=mbs, **dict(extra),
                                            **ctx.constants)
                        for rc in recomputes(ctx, fix, base):
                            for z in zero_stages(fix, dp):
                                plan = ParallelPlan(
                                    tp=tp, pp=pp, dp=dp, cp=cp, sequence_parallel=sp,
                                    micro_batch_size=mbs, recompute=rc, zero_stage=z,
                                    layers_per_stage=None if L % pp == 0 else layers,
                                    **dict(extra), **ctx.constants)
                                if trainer is not None and trainer_reasons(
                                        trainer, model, training, plan, m):
                                    continue
                                bound = m * max(
                                    max(stage_time(layer_costs(ctx, plan, first, g),
                                                   layers[r], r == pp - 1)
                                        for g in stage_types[r]) for r in range(pp))
                                todo.append((bound, plan))
    todo.sort(key=lambda bp: bp[0])
    best: tuple[float, ParallelPlan] | None = None
    for bound, plan in todo:
        if best is not None and bound >= best[0]:
            break
        if check_plan(model, cluster, training, plan):
            continue
        rep = simulate(model, cluster, training, plan)
        if rep.feasible and rep.step_time_s is not None and (
                best is None or rep.step_time_s < best[0]):
            best = (float(rep.step_time_s), plan)
    return (best[0], best[1]) if best else (None, None)




def _runnable(plan: ParallelPlan, trainer: TrainerSpec | None, ctx: Ctx
              ) -> ParallelPlan | None:
    """``plan`` as ``trainer`` can run it: the pipeline ILP splits layers freely, so for a
    trainer that splits them evenly the even split stands in (simulate then says whether it
    still fits); None where the trainer cannot run it either way."""
    if trainer is None:
        return plan
    m = ctx.training.global_batch_size // (plan.dp * plan.micro_batch_size) if plan.dp else None
    if not trainer_reasons(trainer, ctx.model, ctx.training, plan, m):
        return plan
    if plan.layers_per_stage is None or ctx.model.num_layers % plan.pp:
        return None
    even = plan.model_copy(update={"layers_per_stage": None})
    return None if trainer_reasons(trainer, ctx.model, ctx.training, even, m) else even


def _describe(cluster: ClusterSpec) -> str:
    counts: dict[str, int] = {}
    for g in cluster.node_groups:
        counts[g.gpu.name] = counts.get(g.gpu.name, 0) + g.num_gpus
    return ", ".join(f"{v}x {k}" for k, v in counts.items())


def ilp_search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
               fix: dict[str, Any] | None = None, time_limit_s: float = 20.0, top: int = 5,
               progress: Callable[[int, int], None] | None = None,
               trainer: TrainerSpec | None = None) -> IlpResult:
    """Best plans for a (heterogeneous) cluster by pipeline- and data-heterogeneous ILPs.

    Outer loop over structural choices (tp, dp, pp, micro-batch size, recompute, ZeRO
    stage; 1F1B; sequence parallelism whenever tp > 1; ``fix`` pins any ParallelPlan field,
    e.g. ``{"tp": 2, "pp": 4}`` or ``{"mbs": 2, "rc": "full"}``), visited best-first by a
    lower bound on the simulated step time (seconds): first compute-only, then refined with
    the memory limits, integer layers and the 1F1B fill (:func:`span_bound`). A choice is
    solved only while its bound is below the incumbent (the best simulated step so far);
    the rest are pruned. Dominated choices are not enumerated (ZeRO-0/1 under ZeRO-2;
    recompute modes that keep no less memory for no less time). Each solved choice is one
    CBC solve of the pipeline- or data-heterogeneous ILP (module docstring); pipeline plans
    are verified with ``simulate`` on the cluster they actually use, data plans with
    ``simulate`` per GPU type plus the all-type gradient reduction. Plans are ranked by
    simulated ``step_time_s``; GPUs a plan leaves idle are listed in its candidate's
    ``idle_gpus`` (and ``report.extra["idle_gpus"]``). ``reports[0]`` is the best plan over
    all choices; the others are the best of those solved on the way.

    Args:
        model, cluster, training: the specs; every GPU type must support the precision.
        fix: ParallelPlan fields to pin (aliases as in ``--fix``).
        time_limit_s: wall-clock budget of the whole search, seconds; each CBC solve gets
            what is left (at least 1 s). When it runs out the search stops as soon as it has
            a plan and returns the best so far with ``complete=False``.
        top: how many plans to return.
        progress: called with (choices done, choices in all) after each choice.
        trainer: only layouts this trainer can express, with its TP/DP overlap (its other
            run facts are already in ``training``: ``search.dispatch``).

    Returns:
        An :class:`IlpResult`.

    Raises:
        SpecError: bad ``fix`` values, an MoE model whose layers differ (leading dense
            layers), or no plan fits the cluster (the message says how close it came).
    """
    start = time.perf_counter()
    if top < 1:
        raise SpecError(f"top={top} must be >= 1", field="top", value=top)
    if model.is_moe and model.num_dense_layers:
        raise SpecError(f"{model.name} mixes {model.num_dense_layers} dense layers with MoE "
                        "layers; the ILP search needs uniform layers (use the dp/evolutionary "
                        "searchers)", field="model", value=model.name)
    fixed = normalise_fix(fix)
    constants = {k: fixed[k] for k in CONSTANT_FIELDS if k in fixed}
    if trainer is not None:  # every ILP layout runs sequence parallelism with tp > 1
        constants.setdefault("overlap_grad_reduce", trainer.runs.overlap_grad_reduce)
        constants.setdefault("overlap_p2p_comm", trainer.runs.overlap_p2p)
        constants.setdefault("tp_comm_overlap", trainer.runs.tp_comm_overlap)
    ctx = make_context(model, cluster, training, constants)
    choices = enumerate_choices(ctx, fixed)
    if trainer is not None:
        B = training.global_batch_size
        choices = [ch for ch in choices if not trainer_reasons(
            trainer, model, training, ch.plan(constants, dp=ch.dp or None),
            B // (ch.dp * ch.mbs) if ch.formulation == "pipeline" else None)]
    if not choices:
        raise SpecError(f"no legal layout of {model.name} on {cluster.name!r} "
                        f"({_describe(cluster)}) matches fix={fixed}: tp must divide the heads, "
                        "the FFN width and the GPUs per node, dp*mbs the global batch",
                        field="fix", value=fixed)
    bounds = []
    for ch in choices:
        lb = pipeline_bound(ctx, ch) if ch.formulation == "pipeline" else \
            data_bound(ctx, ch, fixed)
        bounds.append((lb, FORMULATIONS.index(ch.formulation), ch))
    bounds.sort(key=lambda x: (x[0], x[1]))
    total = len(bounds)
    cands: list[IlpCandidate] = []
    solves: list[SolveRecord] = []
    pruned = 0
    best_share = 0.0
    complete = True
    # Best-first: pop the choice with the least bound; a choice first carries its cheap
    # bound, then (once its memory limits / replica lines are computed) its refined one;
    # a refined choice at the top of the heap is solved. Stop when the least bound cannot
    # beat the incumbent (the best simulated step so far).
    heap: list[tuple[float, int, int, Any]] = [(lb, 0, i, None) for i, (lb, _, _) in
                                               enumerate(bounds)]
    heapq.heapify(heap)
    cache: dict[tuple, tuple[list[str] | None, list[int] | None, SolveRecord]] = {}
    done = 0
    while heap:
        lb, stage, i, data = heapq.heappop(heap)
        ch = bounds[i][2]
        incumbent = min((c.step_time_s for c in cands), default=math.inf)
        if not math.isfinite(lb) or lb >= incumbent:
            pruned += 1 + len(heap)
            break
        if cands and time_limit_s - (time.perf_counter() - start) <= 0:
            complete = False  # out of time: stop, keeping the plans found so far
            break
        if stage == 0:  # refine the bound, then requeue
            if ch.formulation == "pipeline":
                inp = build_pipeline_inputs(ctx, ch)
                best_share = max(best_share, inp.fit_share)
                heapq.heappush(heap, (max(lb, inp.bound_s), 1, i, inp))
            else:
                line, bound = data_inputs(ctx, ch, fixed)
                if line:
                    best_share = 1.0
                heapq.heappush(heap, (max(lb, bound), 1, i, line))
            continue
        left = time_limit_s - (time.perf_counter() - start)
        done += 1
        if ch.formulation == "pipeline":
            inp = data
            key = inp.key()
            if key not in cache:  # same ILP (e.g. ZeRO-2/3 with equal limits): reuse
                cache[key] = run_pipeline_ilp(inp, left, ch.short(), incumbent)
                solves.append(cache[key][2])
            stage_types, layers, rec = cache[key]
            if stage_types is not None and layers is not None:
                sol = pipeline_solution(ctx, inp, stage_types, layers, rec)
                if not check_plan(model, sol.cluster, training, sol.plan):
                    # The ILP prices 1F1B; the same split under ZB-H1 (same in-flight memory,
                    # the weight-gradient pass fills the cool-down bubble) is re-timed by
                    # simulate and kept when it is faster.
                    best_rep, best_plan = None, sol.plan
                    tried: set[tuple] = set()
                    splits = [sol.layers_per_stage]
                    while splits:
                        # The objective ignores the order of same-type stages, the timeline
                        # does not: swaps of adjacent same-type stages' layer counts are
                        # re-timed by simulate while they improve (ties broken by it).
                        improved = False
                        for split in splits:
                            base = sol.plan.model_copy(update={"layers_per_stage": split})
                            for plan in (base, base.model_copy(update={"schedule": "zb-h1"})):
                                if plan.schedule != "1f1b" and (
                                        plan.pp == 1 or "schedule" in fixed or (
                                        trainer is not None
                                        and "zb-h1" not in trainer.can.schedules)):
                                    continue
                                plan = _runnable(plan, trainer, ctx)
                                if plan is None or _key(plan) in tried:
                                    continue
                                tried.add(_key(plan))
                                rep = simulate(model, sol.cluster, training, plan)
                                if rep.feasible and (best_rep is None
                                                     or rep.step_time_s < best_rep.step_time_s):
                                    best_rep, best_plan, improved = rep, plan, True
                        splits = _adjacent_swaps(best_plan, sol.stage_gpu_types) \
                            if improved else []
                    kept = best_plan.layers_per_stage
                    if kept is not None and kept != sol.layers_per_stage:
                        # A swap won: the ILP's stage times and objective in its order.
                        sol = pipeline_solution(ctx, inp, sol.stage_gpu_types, kept, rec)
                    if best_rep is not None:
                        best_rep.extra.update(formulation="pipeline", idle_gpus=sol.idle_gpus,
                                              ilp_stage_times_s=sol.stage_times_s)
                        cands.append(IlpCandidate(
                            "pipeline", best_rep, best_plan, sol.cluster, sol.stage_gpu_types,
                            sol.stage_times_s, sol.objective_s, sol.idle_gpus, rec))
        else:
            cand, drec = solve_data(ctx, ch, fixed, data, left)
            solves.append(drec)
            if cand is not None:
                cands.append(cand)
        if progress:
            progress(min(total, done + pruned), total)
    if progress:
        progress(total, total)
    if not cands:
        if any(s.status in ("no_solution", "time_limit") for s in solves):
            raise SpecError(f"the ILP solves ran out of time (time_limit_s={time_limit_s:g}) "
                            "before any plan was found; raise time_limit_s",
                            field="time_limit_s", value=time_limit_s)
        raise SpecError(
            f"no plan fits {model.name} on cluster {cluster.name!r} ({_describe(cluster)}): "
            f"across {total} layouts (tp, pp, dp, micro-batch, recompute up to full, ZeRO up "
            f"to 3) the stages hold at best {best_share:.0%} of its {model.num_layers} layers "
            "in GPU memory; add GPUs or GPUs with more memory, or lower seq_len / the global "
            "batch", field="cluster", value=cluster.name)
    cands.sort(key=lambda c: c.step_time_s)
    cands = cands[:top]
    base_step, base_plan = _baseline(ctx, fixed, trainer)
    best = cands[0]
    return IlpResult(
        reports=[c.report for c in cands], plans=[c.plan for c in cands],
        clusters=[c.cluster for c in cands], formulation=best.formulation,
        solver_status=best.solve.status, gap=float(best.solve.gap or 0.0),
        solve_time_s=sum(r.time_s for r in solves), plans_evaluated=len(solves),
        baseline_step_time_s=base_step, baseline_plan=base_plan, candidates=cands,
        solves=solves, choices=total, pruned=pruned, complete=complete,
        search_time_s=time.perf_counter() - start)


def ilp_search_result(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
                      fix: dict[str, Any] | None = None, top: int = 10,
                      time_limit_s: float = 20.0,
                      progress: Callable[[int, int], None] | None = None,
                      trainer: TrainerSpec | None = None) -> Any:
    """:func:`ilp_search` as the common :class:`~paraplan.search.exhaustive.SearchResult`
    (``paraplan best --searcher ilp``). ``baseline_step_time_s`` is the best plan that treats
    every GPU as the slowest type in rank order; the ILP's formulation, solver status,
    optimality gap and solve counts go to ``extra``."""
    from paraplan.search.exhaustive import SearchResult

    res = ilp_search(model, cluster, training, fix=fix, time_limit_s=time_limit_s, top=top,
                     progress=progress, trainer=trainer)
    solver = {"CBC": "CBC", "enumeration": "solved exactly by enumeration"}[
        res.candidates[0].solve.solver]
    notes = [f"ILP ({res.formulation} formulation, {solver}): {res.plans_evaluated} solves over "
             f"{res.choices} layouts, {res.pruned} pruned by a lower bound; best solve "
             f"{res.solver_status}, optimality gap {res.gap:.2%}"]
    if not res.complete:
        notes.append(f"time limit {time_limit_s:g} s reached before every layout was solved "
                     "or pruned: the best plan so far is shown")
    for cand, rep in zip(res.candidates, res.reports, strict=True):
        rep.extra.setdefault("stage_gpu_types_ilp", cand.stage_gpu_types)
        rep.extra.setdefault("cluster_used", cand.cluster.name)
    return SearchResult(
        searcher="ilp", plans_evaluated=res.choices, search_time_s=res.search_time_s,
        reports=list(res.reports), baseline_step_time_s=res.baseline_step_time_s,
        considered=res.choices, rejected={"pruned by a lower bound (never solved)": res.pruned},
        notes=notes,
        extra={"formulation": res.formulation, "solver_status": res.solver_status,
               "optimality_gap": res.gap, "ilp_solves": res.plans_evaluated,
               "solve_time_s": res.solve_time_s, "complete": res.complete,
               "baseline_plan": res.baseline_plan.short() if res.baseline_plan else None})
