"""Inputs of the pipeline-heterogeneous ILP: per-type stage costs, capacities, bottleneck bounds
and boundary p2p costs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from paraplan.search.ilp.bounds import layer_limits, pass_shares, span_bound
from paraplan.search.ilp.clusters import pipeline_cluster
from paraplan.search.ilp.context import Choice, Ctx, layer_costs
from paraplan.simulator import collectives as coll
from paraplan.specs.plan import ParallelPlan


@dataclass(frozen=True)
class PipeInputs:
    """Everything the pipeline ILP of one structural choice needs (seconds, GiB)."""

    plan: ParallelPlan
    p: int
    m: int
    span: int
    types: list[str]
    cap: dict[str, int]
    """Stages each type can host (its GPUs // span)."""
    lmax: list[dict[str, int]]
    peaks: list[list[float]]
    costs: dict[tuple[str, str], tuple[float, float, float, float]]
    """(first type, type) -> (fwd, bwd, head fwd, head bwd) seconds."""
    n_layers: int
    fit_share: float
    """Share of the layers the stages can hold in memory at best (<1: infeasible)."""
    bound_s: float
    """Lower bound on the simulated step time, seconds (inf: infeasible)."""
    p2p_s: float
    """Lower bound on ``simulate``'s per-op pipeline transfer, seconds."""
    p2p_table: dict[tuple[str, str], float]
    """That transfer per (type of stage 0, type of stage 1), seconds."""

    def key(self) -> tuple:
        return (self.p, self.m, tuple(self.types), tuple(self.cap.values()),
                tuple(tuple(row[g] for g in self.types) for row in self.lmax),
                tuple(sorted(self.costs.items())))


def _bottleneck_bound(c: dict[str, float], head: dict[str, float], cap: dict[str, int],
                      lmax: list[dict[str, int]], n_layers: int) -> float:
    """Smallest bottleneck T (seconds) at which p stages could hold all layers, or inf.

    Relaxation of the pipeline ILP without the contiguity rule: at T a stage of type g
    holds at most min(Lmax[k][g], floor((T - head_g [last stage]) / c_g)) layers, with
    c_g, head_g the cheapest costs over which type leads; the most layers p stages can
    hold under the GPU counts is an assignment problem (positions x type slots, solved
    exactly by ``scipy.optimize.linear_sum_assignment``). Binary search over the values a
    stage time can take.
    """
    p = len(lmax)
    types = list(cap)
    slots = [g for g in types for _ in range(min(cap[g], p))]
    if len(slots) < p:
        return math.inf
    lm = np.array([[row[g] for g in slots] for row in lmax], dtype=float)
    cs = np.array([c[g] for g in slots])
    hs = np.array([head[g] for g in slots])
    last = np.zeros((p, 1))
    last[-1] = 1.0

    def fits(t: float) -> bool:
        room = (t - last * hs[None, :]) / cs[None, :]
        n = np.minimum(lm, np.floor(room * (1.0 + 1e-12)))
        val = np.where(n >= 1, n, -1e6)
        rows, cols = linear_sum_assignment(val, maximize=True)
        got = val[rows, cols]
        return len(rows) == p and got.min() >= 1 and got.sum() >= n_layers

    levels = _levels(c, head, n_layers)
    if not fits(levels[-1]):
        return math.inf
    lo, hi = 0, len(levels) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(levels[mid]):
            hi = mid
        else:
            lo = mid + 1
    return levels[lo]


def _levels(c: dict[str, float], head: dict[str, float], n_layers: int) -> list[float]:
    """Every value a stage's time can take (n layers of a type, with or without the LM
    head), ascending, seconds."""
    return sorted({n * c[g] + extra for g in c for n in range(1, n_layers + 1)
                   for extra in (0.0, head[g])})


def _least_total(level: float, c: dict[str, float], best_lmax: dict[str, list[int]],
                 n_layers: int, head_min: float) -> float:
    """Least sum of stage times (seconds) when no stage exceeds ``level``: the fastest types
    first, type g holding at most min(Lmax, floor(level / c_g)) layers on each of its best
    positions (``best_lmax[g]``: its cap_g largest Lmax, descending); a fractional knapsack
    that relaxes one type per stage. Plus the cheapest LM head; inf when the layers do not
    fit."""
    total, left = head_min, n_layers
    for g in sorted(c, key=lambda g: c[g]):
        q = level / c[g] * (1.0 + 1e-12)
        q = math.floor(q) if math.isfinite(q) else n_layers
        take = min(left, sum(min(x, q) for x in best_lmax[g]))
        total += take * c[g]
        left -= take
        if not left:
            return total
    return math.inf


def _p2p_table(ctx: Ctx, types: Sequence[str], cap: dict[str, int], plan: ParallelPlan,
               span: int) -> dict[tuple[str, str], float]:
    """Seconds of the pipeline transfer ``simulate`` charges after every forward and backward
    op, per (type before, type after) a stage boundary: ``simulate`` charges the slowest
    boundary's send (Megatron's scatter-gather send of b*s*h/tp) on every op. A boundary
    between two types is priced on ``pipeline_cluster([h, h2])``; one inside a run of h as
    the slowest boundary of min(pp, stages h can host) stages of h (exact when the whole
    pipeline is h, an upper bound for shorter runs)."""
    if plan.pp < 2:
        return {}
    nbytes = (plan.micro_batch_size * ctx.training.seq_len / plan.cp * ctx.model.hidden_size
              * ctx.training.compute_bytes / plan.tp)
    out: dict[tuple[str, str], float] = {}
    for h in types:
        if cap.get(h, 0) < 1:
            continue
        for h2 in types:
            if cap.get(h2, 0) < 1 or (h2 == h and cap[h] < 2):
                continue
            # A boundary inside a run of h: the slowest of the run's boundaries (simulate
            # charges the slowest boundary on every send); between runs: the crossing.
            n = min(plan.pp, cap[h]) if h2 == h else 2
            key = ("p2p-lines", h, h2, span, n, plan.tp)
            lines = ctx.probes_p2p.get(key)
            if lines is None:  # (latency s, bytes/s) of the distinct boundary pairs
                cl = pipeline_cluster(ctx.cluster, [h] * n if h2 == h else [h, h2], span)
                lines = ctx.probes_p2p[key] = coll.pipeline_p2p_lines(cl.topology, span, n,
                                                                      plan.tp)
            out[h, h2] = max((coll.p2p(nbytes, bps, lat) for lat, bps in lines), default=0.0)
    return out


def build_pipeline_inputs(ctx: Ctx, ch: Choice) -> PipeInputs:
    """Layer limits, costs and the refined lower bound of one pipeline choice."""
    L, p = ctx.model.num_layers, ch.pp
    span = ch.dp * ch.tp * ch.cp
    m = ctx.training.global_batch_size // (ch.dp * ch.mbs)
    plan = ch.plan(ctx.constants)
    cap = {g: t.num_gpus // span for g, t in ctx.types.items()
           if t.gpn_gcd % ch.tp == 0 and t.num_gpus // span > 0}
    types = list(cap)
    lmax, peaks = layer_limits(ctx, plan, m, types)
    best = [max(lmax[k].values(), default=0) for k in range(p)]
    share = min(1.0, sum(best) / L)
    costs = {(h, g): layer_costs(ctx, plan, h, g) for h in types for g in types}
    bound, p2p = math.inf, 0.0
    p2p_table: dict[tuple[str, str], float] = {}
    if min(best) >= 1 and sum(best) >= L:
        c = {g: min(costs[h, g][0] + costs[h, g][1] for h in types) for g in types}
        head = {g: min(costs[h, g][2] + costs[h, g][3] for h in types) for g in types}
        t_lb = _bottleneck_bound(c, head, cap, lmax, L)
        if math.isfinite(t_lb):
            p2p_table = _p2p_table(ctx, types, cap, plan, span)
            p2p = min(p2p_table.values(), default=math.inf) if p > 1 else 0.0
            last = [g for g in types if lmax[-1][g] >= 1]
            last_min = min(c[g] + head[g] for g in last)
            head_min = min(head[g] for g in last)
            shares = pass_shares(list(costs.values()))
            best_lmax = {g: sorted((row[g] for row in lmax), reverse=True)[:cap[g]]
                         for g in types}
            floor_total = _least_total(math.inf, c, best_lmax, L, head_min)
            # The true bottleneck V >= t_lb is unknown: the bound is the least over the
            # levels V of the bound at V (the sum of stage times shrinks as V grows, the
            # rest grows; stop once even the least sum cannot bring it lower).
            for v in _levels(c, head, L):
                if v < t_lb:
                    continue
                if span_bound(m, p, v, floor_total, last_min, p2p, *shares) >= bound:
                    break
                bound = min(bound, span_bound(
                    m, p, v, _least_total(v, c, best_lmax, L, head_min), last_min, p2p,
                    *shares))
    return PipeInputs(plan, p, m, span, types, cap, lmax, peaks, costs, L, share,
                      bound, p2p, p2p_table)
