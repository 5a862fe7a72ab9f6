"""Lower bounds on the simulated step of a structural choice (they prune the best-first search),
and per-stage layer limits from memory."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from paraplan.search.ilp.context import Choice, Ctx, activations, layer_costs, stage_time
from paraplan.simulator.memory import GiB, pipeline_memory
from paraplan.simulator.moe import a2a_overlap_warmup
from paraplan.simulator.pipeline import inflight_microbatches
from paraplan.simulator.step import even_split
from paraplan.specs.plan import ParallelPlan


def span_bound(m: int, p: int, bottleneck: float, total: float, last_min: float,
               p2p: float, fwd_share: float, bwd_share: float) -> float:
    """Lower bound on the 1F1B pipeline span ``simulate`` reports, seconds.

    Every forward/backward op is followed by its blocking transfer (p2p), so stage k
    spends u_k = t_k + 2 p2p per micro-batch; S = sum_k u_k is one micro-batch's round trip.

    * Stage k cannot start before micro-batch 0 reaches it, then runs m pairs, and its last
      backward must travel back to stage 0: span >= m u_k + sum_{j<k} u_j; at the
      bottleneck, span >= m (T + 2 p2p); at the last stage, S + (m - 1) u_last.
    * In 1F1B stage k runs all m - 1 earlier forwards and max(0, m - p + k) backwards
      before the last micro-batch's forward, which then needs the whole round trip S:
      span >= S + (m - 1)(f_k + p2p) + max(0, m - p + k)(b_k + p2p), weakest at k = 0; with
      f_k >= ``fwd_share`` t_k and b_k >= ``bwd_share`` t_k at the bottleneck stage.

    ``total`` is a lower bound on sum_k t_k, ``last_min`` on the last stage's t, seconds.
    """
    s = total + 2.0 * p * p2p
    return max(m * (bottleneck + 2.0 * p2p),
               s + (m - 1) * (last_min + 2.0 * p2p),
               s + (m - 1) * (fwd_share * bottleneck + p2p)
               + max(0, m - p) * (bwd_share * bottleneck + p2p))


def pass_shares(costs: Sequence[tuple[float, float, float, float]]) -> tuple[float, float]:
    """Least forward and least backward share of a stage's time over these costs."""
    fwd = min(min(f / (f + b), hf / (hf + hb)) for f, b, hf, hb in costs)
    bwd = min(min(b / (f + b), hb / (hf + hb)) for f, b, hf, hb in costs)
    return fwd, bwd


def pipeline_bound(ctx: Ctx, ch: Choice) -> float:
    """Compute-only lower bound on the step time of any plan of choice ``ch``, seconds.

    The slowest of p stages takes T >= (L + min_g head_g/c_g) / sum_k 1/c_k (fractional
    layers; c_k per-layer seconds of stage k's type, best over which type leads, on the p
    fastest stages the GPU counts allow); the span then follows :func:`span_bound`
    (without transfers, whose links are not known yet).
    """
    plan = ch.plan(ctx.constants)
    span = ch.dp * ch.tp * ch.cp
    m = ctx.training.global_batch_size // (ch.dp * ch.mbs)
    per: list[tuple[float, int, float]] = []
    every: list[tuple[float, float, float, float]] = []
    for g, info in ctx.types.items():
        if info.gpn_gcd % ch.tp:
            continue
        cnt = info.num_gpus // span
        if not cnt:
            continue
        costs = [layer_costs(ctx, plan, h, g) for h in ctx.types]
        every += costs
        c = min(f + b for f, b, _, _ in costs)
        head = min(hf + hb for _, _, hf, hb in costs)
        per.append((c, cnt, head))
    per.sort()
    inv, left = 0.0, ch.pp
    for c, cnt, _ in per:
        take = min(cnt, left)
        inv += take / c
        left -= take
        if not left:
            break
    if left:
        return math.inf
    n_layers = ctx.model.num_layers
    t_lb = (n_layers + min(h / c for c, _, h in per)) / inv
    total = n_layers * per[0][0] + min(h for _, _, h in per)
    return span_bound(m, ch.pp, t_lb, total, min(c + h for c, _, h in per), 0.0,
                      *pass_shares(every))


def replica_times(ctx: Ctx, ch: Choice, types: Sequence[str],
                  ) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
    """Per GPU type: a replica's even-split stage times (forward + backward of one
    micro-batch, LM head on the last; seconds), their prefix sums, and how many replicas
    of tp*pp*cp GPUs the type has."""
    plan = ch.plan(ctx.constants, dp=None)
    width = ch.tp * ch.pp * ch.cp
    split = even_split(ctx.model.num_layers, ch.pp)
    out = {}
    for g in types:
        info = ctx.types[g]
        if info.gpn_gcd % ch.tp or info.num_gpus < width:
            continue
        costs = layer_costs(ctx, plan, g, g)
        t = np.array([stage_time(costs, split[r], r == ch.pp - 1) for r in range(ch.pp)])
        out[g] = (t, np.concatenate([[0.0], np.cumsum(t)[:-1]]), info.num_gpus // width)
    return out


def replica_bound(times: dict[str, tuple[np.ndarray, np.ndarray, int]], microbatches: int,
                  replicas: int | None = None) -> float:
    """Lower bound on the slowest replica's step when replicas share ``microbatches``,
    seconds: a replica of type g running n micro-batches spans at least
    max_k (n t_k + sum_{j<k} t_j) (:func:`span_bound`'s argument on its own pipeline), so
    by T it finishes at most floor(min_k (T - P_k) / t_k) of them; the least T at which
    the replicas (the ``replicas`` fastest when dp is pinned) cover M micro-batches."""
    if not times:
        return math.inf
    items = sorted(times.values(), key=lambda tpc: float(tpc[0].max()))
    if replicas is not None:
        kept, left = [], replicas
        for t, pre, cnt in items:
            if left > 0:
                kept.append((t, pre, min(cnt, left)))
                left -= min(cnt, left)
        items = kept
    n = np.arange(1, microbatches + 1, dtype=float)
    levels = np.unique(np.concatenate(
        [np.max(n[:, None] * t[None, :] + pre[None, :], axis=1) for t, pre, _ in items]))

    def fits(level: float) -> bool:
        done = 0
        for t, pre, cnt in items:
            k = math.floor(float(np.min((level - pre) / t)) * (1.0 + 1e-12) + 1e-9)
            done += cnt * max(0, k)
        return done >= microbatches

    least = least_level(levels, fits)
    return math.inf if least is None else least


def least_level(levels: np.ndarray, fits: Callable[[float], bool]) -> float | None:
    """The least of the sorted ``levels`` (seconds) at which ``fits`` holds, by bisection
    (``fits`` must stay true once true); None when even the largest does not fit."""
    if not len(levels) or not fits(float(levels[-1])):
        return None
    lo, hi = 0, len(levels) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(float(levels[mid])):
            hi = mid
        else:
            lo = mid + 1
    return float(levels[lo])


def data_bound(ctx: Ctx, ch: Choice, fix: dict[str, Any]) -> float:
    """Compute-only lower bound for the data-heterogeneous choice, seconds
    (:func:`replica_bound` over every GPU type)."""
    dp = int(fix["dp"]) if fix.get("dp") is not None else None
    return replica_bound(replica_times(ctx, ch, list(ctx.types)),
                         ctx.training.global_batch_size // ch.mbs, dp)




def layer_limits(ctx: Ctx, plan: ParallelPlan, m: int,
                 types: Sequence[str]) -> tuple[list[dict[str, int]], list[list[float]]]:
    """Largest layer count each stage position can hold on each GPU type.

    Returns (``lmax[k][g]`` in 0..L-p+1, 0 = not even one layer fits; ``peaks[l][k]`` the peak
    GiB of stage k holding l layers). Exact: a stage's peak (``pipeline_memory``) is
    non-decreasing in its layer count, so "fits" is an interval [1, lmax]; the DDP bucket
    term min(params, 40M elements) x 4 B makes the peak piecewise-linear in the layers, which
    is why it enters the ILP as this bound and not as one linear row.
    """
    p, L = plan.pp, ctx.model.num_layers
    la = activations(ctx, plan)
    warm = a2a_overlap_warmup(ctx.model, ctx.training, plan)
    inflight = [inflight_microbatches("1f1b", p, m, k, extra=warm) for k in range(p)]
    caps = {g: ctx.types[g].gpu.memory_GiB for g in types}
    top = max(caps.values(), default=0.0)
    lmax = [dict.fromkeys(types, 0) for _ in range(p)]
    peaks: list[list[float]] = [[math.inf] * p]  # l = 0 is never allowed
    for n in range(1, L - p + 2):
        mems = pipeline_memory(ctx.model, ctx.training, plan, dp=plan.dp or 1, layers=[n] * p,
                               inflight=inflight, per_layer=la)
        gib = [mm.peak / GiB for mm in mems]
        peaks.append(gib)
        for k in range(p):
            for g in types:
                if gib[k] <= caps[g]:
                    lmax[k][g] = n
        if min(gib) > top:
            break
    return lmax, peaks
