"""The pipeline-heterogeneous ILP: the GPU type of each stage and the integer layer split
(Metis/AMP-style objective)."""

from __future__ import annotations

import math
from typing import Any

import pulp

from paraplan.search.ilp.bounds import pass_shares
from paraplan.search.ilp.cbc import MS, lp_var, solve_cbc
from paraplan.search.ilp.clusters import pipeline_cluster
from paraplan.search.ilp.context import Choice, Ctx, make_context, stage_time
from paraplan.search.ilp.pipeline_inputs import PipeInputs, build_pipeline_inputs
from paraplan.search.ilp.results import PipelineSolution, SolveRecord
from paraplan.search.space import CONSTANT_FIELDS
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec


def run_pipeline_ilp(inp: PipeInputs, time_limit_s: float, choice: str,
                  cutoff_s: float = math.inf,
                  ) -> tuple[list[str] | None, list[int] | None, SolveRecord]:
    """Solve the pipeline ILP: (stage types, layers per stage, record); None when no solution.

    Variables (times in milliseconds): y[k,g] binary, stage k on GPU type g; l[k,g] integer
    layers; t_k stage time; T bottleneck; w[h,h2] in [0,1].

    * one type per stage: sum_g y[k,g] = 1; GPUs: sum_k y[k,g] <= GPUs of g // (dp*tp*cp);
    * y[k,g] <= l[k,g] <= Lmax[k,g] y[k,g] (>= 1 layer, the memory limit, and the
      linearisation of "layers x type"); sum_{k,g} l[k,g] = L;
    * each type one contiguous run: z[k,g] >= y[k,g] - y[k-1,g], sum_k z[k,g] <= 1;
    * t_k >= sum_g c_g l[k,g] (+ the LM head on the last stage); when TP/CP costs depend on
      the type that leads (``simulate`` prices them on stage 0's links) the layers are
      disaggregated by that type; T >= t_k;
    * P >= p2p[h,h2] w[h,h2] for every type pair, w[h,h2] >= y[k,h] + y[k+1,h2] - 1 for
      every boundary k: the transfer ``simulate`` puts after every op, at the slowest stage
      boundary;
    * interior stages of one run keep non-decreasing layer counts (symmetry breaking; their
      Lmax is non-decreasing in k).

    Objective: AMP's pipeline latency with every op's transfer,
    (m - 1)(T + 2P) + sum_k (t_k + 2P).

    ``cutoff_s``: plans whose simulated step could not beat this (seconds) are excluded by
    :func:`span_bound`'s bounds as rows (m (T + 2P) <= cutoff, and the 1F1B fill bound);
    status ``cutoff`` when nothing is left.
    """
    p, types, lmax, costs, L = inp.p, inp.types, inp.lmax, inp.costs, inp.n_layers
    leaders = [h for h in types if lmax[0][h] >= 1]
    # First types whose per-layer costs are identical share one set of time rows.
    classes: dict[tuple, list[str]] = {}
    for h in leaders:
        classes.setdefault(tuple(costs[h, g] for g in types), []).append(h)

    prob = pulp.LpProblem("pipeline_hetero", pulp.LpMinimize)
    cells = [(k, g) for k in range(p) for g in types if lmax[k][g] >= 1]
    y = {kg: lp_var(prob, f"y_{kg[0]}_{types.index(kg[1])}", cat="Binary") for kg in cells}
    lv = {kg: lp_var(prob, f"l_{kg[0]}_{types.index(kg[1])}", 0, lmax[kg[0]][kg[1]], "Integer")
          for kg in cells}
    big_t = lp_var(prob, "T", 0)
    t = [lp_var(prob, f"t_{k}", 0) for k in range(p)]
    # simulate's one transfer per op at the slowest stage boundary: P >= the cost of every
    # boundary k -> k+1, whose type pair is w_k[h,h2] = y[k,h] AND y[k+1,h2].
    p2p: Any = 0.0
    if p > 1:
        # w[h,h2] = 1 when some boundary k has stage k on h and stage k+1 on h2; P is at
        # least the cost of every pair that occurs.
        p2p = lp_var(prob, "P", 0)
        for hh, cost in inp.p2p_table.items():
            ks = [k for k in range(p - 1) if (k, hh[0]) in y and (k + 1, hh[1]) in y]
            if not ks:
                continue
            var = lp_var(prob, f"w_{types.index(hh[0])}_{types.index(hh[1])}", 0, 1)
            for k in ks:
                prob += var >= y[k, hh[0]] + y[k + 1, hh[1]] - 1
            prob += p2p >= MS * cost * var
    prob += (inp.m - 1) * big_t + pulp.lpSum(t) + 2.0 * (inp.m - 1 + p) * p2p
    if math.isfinite(cutoff_s):  # the step bounds of span_bound must stay below it
        m = inp.m
        fwd, bwd = pass_shares(list(costs.values()))
        prob += m * (big_t + 2.0 * p2p) <= MS * cutoff_s
        prob += (pulp.lpSum(t) + 2.0 * p * p2p + (m - 1) * (fwd * big_t + p2p)
                 + max(0, m - p) * (bwd * big_t + p2p)) <= MS * cutoff_s
    for k in range(p):
        prob += pulp.lpSum(y[k, g] for g in types if (k, g) in y) == 1
    for g in types:
        prob += pulp.lpSum(y[k, g] for k in range(p) if (k, g) in y) <= inp.cap[g]
    for kg in cells:
        prob += lv[kg] <= lmax[kg[0]][kg[1]] * y[kg]
        prob += lv[kg] >= y[kg]
    prob += pulp.lpSum(lv.values()) == L
    if len(types) > 1:  # each type hosts one contiguous run of stages
        for g in types:
            z = [lp_var(prob, f"z_{k}_{types.index(g)}", 0, 1) for k in range(p)]
            for k in range(p):
                prob += z[k] >= y.get((k, g), 0) - (y.get((k - 1, g), 0) if k else 0)
            prob += pulp.lpSum(z) <= 1
    if len(classes) == 1:
        cc = dict(zip(types, next(iter(classes)), strict=True))
        for k in range(p):
            expr = pulp.lpSum(MS * (cc[g][0] + cc[g][1]) * lv[k, g]
                              for g in types if (k, g) in lv)
            if k == p - 1:
                expr += pulp.lpSum(MS * (cc[g][2] + cc[g][3]) * y[k, g]
                                   for g in types if (k, g) in y)
            prob += t[k] >= expr
    else:
        # Disaggregate by the leading type's cost class c: l[k,g] = sum_c lc[k,g,c] with
        # lc[k,g,c] <= Lmax y0[c] (only the actual leader's copy is non-zero), and the LM
        # head through h[g,c] >= y[p-1,g] + y0[c] - 1. Exact, and a far tighter LP than
        # big-M rows.
        lead = {i: pulp.lpSum(y[0, h] for h in heads)
                for i, heads in enumerate(classes.values())}
        cls_costs = [dict(zip(types, cls, strict=True)) for cls in classes]
        lc = {(k, g, i): lp_var(prob, f"lc_{k}_{types.index(g)}_{i}", 0)
              for (k, g) in cells for i in lead}
        for (k, g) in cells:
            prob += pulp.lpSum(lc[k, g, i] for i in lead) == lv[k, g]
            for i in lead:
                prob += lc[k, g, i] <= lmax[k][g] * lead[i]
        hv = {}
        for g in types:
            if (p - 1, g) in y:
                for i in lead:
                    hv[g, i] = lp_var(prob, f"h_{types.index(g)}_{i}", 0)
                    prob += hv[g, i] >= y[p - 1, g] + lead[i] - 1
        for k in range(p):
            expr = pulp.lpSum(MS * (cls_costs[i][g][0] + cls_costs[i][g][1]) * lc[k, g, i]
                              for g in types if (k, g) in lv for i in lead)
            if k == p - 1:
                expr += pulp.lpSum(MS * (cls_costs[i][g][2] + cls_costs[i][g][3]) * hv[g, i]
                                   for (g, i) in hv)
            prob += t[k] >= expr
    for k in range(p):
        prob += big_t >= t[k]
    # Symmetry: interior stages of one run (same static memory, in-flight non-increasing in
    # k, so Lmax non-decreasing) are interchangeable; keep their layer counts non-decreasing.
    for k in range(1, p - 2):
        for g in types:
            if (k, g) in lv and (k + 1, g) in lv:
                prob += lv[k, g] <= lv[k + 1, g] + lmax[k][g] * (1 - y[k + 1, g])

    rec = solve_cbc(prob, time_limit_s, "pipeline", choice)
    if rec.status == "infeasible" and math.isfinite(cutoff_s):
        rec = SolveRecord(rec.formulation, rec.choice, "cutoff", None, None, None, rec.time_s)
    if rec.objective is None:
        return None, None, rec
    stage_types: list[str] = []
    layers: list[int] = []
    for k in range(p):
        g = max((g for g in types if (k, g) in y), key=lambda g: y[k, g].varValue or 0.0)
        stage_types.append(g)
        layers.append(int(round(lv[k, g].varValue or 0.0)))
    if sum(layers) != L or min(layers) < 1:  # pragma: no cover - CBC tolerance guard
        return None, None, rec
    return stage_types, layers, rec


def pipeline_solution(ctx: Ctx, inp: PipeInputs, stage_types: list[str],
                      layers: list[int], rec: SolveRecord) -> PipelineSolution:
    """The ILP's integer answer evaluated in seconds/GiB and laid out on a cluster."""
    p = inp.p
    lead = stage_types[0]
    times = [stage_time(inp.costs[lead, stage_types[k]], layers[k], k == p - 1)
             for k in range(p)]
    mem = [inp.peaks[layers[k]][k] for k in range(p)]
    idle = {g: t.num_gpus - stage_types.count(g) * inp.span for g, t in ctx.types.items()}
    p2p = max((inp.p2p_table[stage_types[k], stage_types[k + 1]] for k in range(p - 1)),
              default=0.0)
    m = inp.m
    return PipelineSolution(
        plan=inp.plan.model_copy(update={"layers_per_stage": list(layers)}),
        cluster=pipeline_cluster(ctx.cluster, stage_types, inp.span),
        stage_gpu_types=list(stage_types), layers_per_stage=list(layers), stage_times_s=times,
        stage_memory_gb=mem, bottleneck_s=max(times), p2p_s=p2p,
        objective_s=(m - 1) * (max(times) + 2 * p2p) + sum(times) + 2 * p * p2p,
        idle_gpus=idle, solve=rec)


def solve_pipeline_ilp(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                       plan: ParallelPlan, *, time_limit_s: float = 20.0) -> PipelineSolution:
    """The pipeline-heterogeneous ILP for one structural choice (see the module docstring).

    ``plan`` gives tp, dp (required), pp, cp, micro-batch size, recompute, ZeRO stage and
    sequence parallelism (schedule must be 1F1B, one chunk per rank); its
    ``layers_per_stage`` is ignored. The ILP picks each stage's GPU type and layer count to
    minimise (m - 1)(max_k t_k + 2 p2p) + sum_k (t_k + 2 p2p) (seconds; AMP's pipeline
    latency with ``simulate``'s per-op transfer) with every stage's peak memory within its
    type's ``memory_GiB`` (GiB). GPUs beyond dp*tp*cp*pp stay idle (``idle_gpus``).

    Raises:
        SpecError: an illegal choice, or no placement fits the cluster's GPUs and memory.
    """
    if plan.dp is None:
        raise SpecError("solve_pipeline_ilp needs plan.dp (stages hold dp*tp*cp GPUs each)",
                        field="plan.dp", value=None)
    if plan.schedule != "1f1b" or plan.virtual_stages != 1:
        raise SpecError("solve_pipeline_ilp models the 1f1b schedule with one chunk per rank",
                        field="plan.schedule", value=plan.schedule, allowed=["1f1b"])
    constants = {k: getattr(plan, k) for k in CONSTANT_FIELDS}
    ctx = make_context(model, cluster, training, constants)
    extra = tuple((k, getattr(plan, k)) for k in ("ep", "etp")
                  if getattr(plan, k) not in (None, 1))
    ch = Choice("pipeline", plan.tp, plan.dp, plan.pp, plan.cp, plan.micro_batch_size,
                plan.recompute, plan.zero_stage, plan.sequence_parallel, extra)
    if training.global_batch_size % (plan.dp * plan.micro_batch_size):
        raise SpecError(f"global_batch_size={training.global_batch_size} is not divisible by "
                        f"dp*micro_batch_size={plan.dp * plan.micro_batch_size}",
                        field="plan.micro_batch_size", value=plan.micro_batch_size)
    inp = build_pipeline_inputs(ctx, ch)
    if not math.isfinite(inp.bound_s):
        raise SpecError(f"no placement of {model.name} with {plan.short()} fits cluster "
                        f"{cluster.name!r}: at best the stages hold {inp.fit_share:.0%} of its "
                        f"{model.num_layers} layers in GPU memory", field="plan",
                        value=plan.short())
    stage_types, layers, rec = run_pipeline_ilp(inp, time_limit_s, ch.short())
    if stage_types is None or layers is None:
        raise SpecError(f"the pipeline ILP for {plan.short()} on {cluster.name!r} ended with "
                        f"status {rec.status}", field="plan", value=plan.short())
    return pipeline_solution(ctx, inp, stage_types, layers, rec)
