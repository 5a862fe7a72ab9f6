"""The data-heterogeneous ILP: per-replica micro-batch shares on whole pipelines of one GPU type
(HetPipe/Whale-style)."""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pulp

from paraplan.search.ilp.bounds import least_level, replica_bound, replica_times
from paraplan.search.ilp.cbc import MS, lp_var, solve_cbc
from paraplan.search.ilp.clusters import assemble, take_gpus
from paraplan.search.ilp.context import Choice, Ctx
from paraplan.search.ilp.results import DataGroup, IlpCandidate, SolveRecord
from paraplan.simulator.compute import Device
from paraplan.simulator.dp_sync import exposed_grad_sync, grad_sync_parts, overlapped_grad_sync
from paraplan.simulator.flops import hardware_flops_per_step, model_flops_per_step
from paraplan.simulator.memory import dp_bucket_elements, params_per_stage
from paraplan.simulator.selective_ac import rerun_skips_down_projection
from paraplan.simulator.step import StepReport, even_split, simulate
from paraplan.specs.cluster import ClusterSpec, NodeGroup
from paraplan.specs.plan import ParallelPlan


def _replica_plan(ctx: Ctx, ch: Choice, dp: int) -> ParallelPlan:
    layers = None if ctx.model.num_layers % ch.pp == 0 else even_split(ctx.model.num_layers,
                                                                       ch.pp)
    return ch.plan(ctx.constants, dp=dp, layers_per_stage=layers)


def _simulate_group(ctx: Ctx, ch: Choice, gpu: str, replicas: int,
                    microbatches: int) -> tuple[StepReport, ParallelPlan, ClusterSpec]:
    """``simulate`` of ``replicas`` pipelines on the first GPUs of type ``gpu``, each running
    ``microbatches`` micro-batches (ZeRO shards over these replicas)."""
    width = ch.tp * ch.pp * ch.cp
    sub = assemble(ctx.cluster, take_gpus(ctx.cluster, gpu, 0, replicas * width), gpu)
    train = ctx.training.model_copy(
        update={"global_batch_size": replicas * microbatches * ch.mbs})
    plan = _replica_plan(ctx, ch, replicas)
    # The whole job's slowest part paces every group: the world the bounds price
    # (``bounds.replica_times``: dp left to the cluster).
    job = ch.plan(ctx.constants, dp=None).world_size(ctx.cluster.num_gpus)
    return simulate(ctx.model, sub, train, plan, job_gpus=job), plan, sub


def _union_dp_time(ctx: Ctx, group: DataGroup, cluster: ClusterSpec,
                   union: tuple[int, ...]) -> float:
    """Exposed data-parallel synchronisation when the gradients of all types are all-reduced
    together and ``group`` finishes its backward last (seconds): ``simulate``'s own rule
    (``dp_sync.grad_sync_parts``: DDP buckets of max(40M, 1M x dp) elements over the
    data-parallel ranks of stage 0, overlapped with the first stage's backward of one
    micro-batch, NCCL slowing the overlapped compute; ZeRO-2 reduce-scatters every
    micro-batch's gradients, DDP without ``no_sync`` all-reduces them) applied to ``union``,
    the stage-0 data-parallel ranks of all types on ``cluster``. With one type it is exactly
    what ``simulate`` charges. FSDP's per-layer gathers (ZeRO-3, and ZeRO-2 where
    ``TrainingSpec.zero2_regather``) are not re-priced here: ``choices`` leaves them out of
    the data formulation."""
    rep, plan = group.report, group.plan
    if len(union) < 2:
        return 0.0
    layers = rep.extra["layers_per_stage"]
    times = [f + b for f, b in zip(rep.extra["stage_forward_s"], rep.extra["stage_backward_s"],
                                   strict=True)]
    crit = max(range(len(times)), key=lambda r: times[r])
    dense, experts = params_per_stage(ctx.model, plan, layers, crit)
    buckets = max(1.0, (dense + experts) / float(dp_bucket_elements(plan.dp or len(union),
                                                                  ctx.training.ddp_bucket_size)))
    dev = Device.of_training(ctx.types[group.gpu].gpu, ctx.training)  # its NCCL share only

    def exposed(sync: float) -> float:
        if not plan.overlap_grad_reduce:
            return sync
        return float(overlapped_grad_sync(sync, float(rep.extra["stage_backward_s"][0]),
                                          buckets, dev.nccl_slowdown))

    grads, params = grad_sync_parts(cluster.topology, union, ctx.model, plan, ctx.training,
                                    dense + experts)
    return exposed_grad_sync(ctx.training, plan, int(rep.extra["num_microbatches"]), grads,
                             params, exposed)


def _compose(ctx: Ctx, ch: Choice, groups: list[DataGroup], cluster: ClusterSpec,
             pre: list[float], slow: int, dp_time: float) -> tuple[StepReport, ParallelPlan]:
    """One StepReport for a data-heterogeneous plan: the last type to finish (``slow``, by
    its step without data-parallel synchronisation, ``pre``) plus the synchronisation of
    all types' gradients (seconds); memory of the type closest to its capacity; MFU over
    the GPUs used."""
    step = pre[slow] + dp_time
    n = cluster.num_gpus
    tr = ctx.training
    replicas = sum(gr.replicas for gr in groups)
    plan = _replica_plan(ctx, ch, replicas)
    mtf = model_flops_per_step(ctx.model, tr.global_batch_size, tr.seq_len) / step / n
    htf = hardware_flops_per_step(ctx.model, tr.global_batch_size, tr.seq_len, ch.recompute,
                                  skip_down_proj=rerun_skips_down_projection(tr)) / step / n
    peak = sum(g.num_gpus * g.gpu.peak_flops(tr.precision) for g in cluster.node_groups) / n
    worst = min(groups, key=lambda gr: gr.report.extra.get("memory_headroom_gb", 0.0))
    base = groups[slow].report
    times = dict(base.time_s)
    times["exposed_comm"] = times.get("exposed_comm", 0.0) - times.get("dp_comm", 0.0) \
        + dp_time
    times["dp_comm"] = dp_time
    extra = {
        "formulation": "data", "dp": replicas, "num_gpus": n,
        "plan_short": plan.short() + " (data-heterogeneous)",
        "groups": [{"gpu": gr.gpu, "replicas": gr.replicas,
                    "microbatches_per_replica": gr.microbatches_per_replica,
                    "global_batch": gr.global_batch, "compute_end_s": s}
                   for gr, s in zip(groups, pre, strict=True)],
        "memory_capacity_gb": worst.report.extra.get("memory_capacity_gb"),
        "memory_headroom_gb": worst.report.extra.get("memory_headroom_gb"),
        "num_microbatches": max(max(gr.microbatches_per_replica) for gr in groups),
        "slowest_part_pace": {k: v for gr in groups
                              for k, v in gr.report.extra.get("slowest_part_pace", {}).items()},
    }
    report = StepReport(
        feasible=True, reasons=[], step_time_s=step, tokens_per_s=tr.tokens_per_step / step,
        model_tflops_per_gpu=mtf / 1e12, hardware_tflops_per_gpu=htf / 1e12,
        mfu=mtf / peak, hfu=htf / peak, memory_gb=dict(worst.report.memory_gb),
        memory_per_stage_gb=list(worst.report.memory_per_stage_gb), time_s=times,
        plan=plan.model_dump(), extra=extra)
    return report, plan


def data_inputs(ctx: Ctx, ch: Choice,
                fix: dict[str, Any]) -> tuple[dict[str, tuple[float, float]], float]:
    """Per GPU type the affine replica step (alpha_g, beta_g) seconds, and a lower bound on
    the step of any data-heterogeneous plan of ``ch`` (inf: nothing fits).

    ``simulate`` of all R_g replicas of type g at n = p and 2p micro-batches each gives
    alpha_g n + beta_g (1F1B: fill/drain, transfers, the type's gradient reduction and the
    optimizer in beta); a type whose R_g replicas do not fit in memory at n = p (the most
    micro-batches in flight) is left out. The bound is :func:`replica_bound` over the
    types that fit.
    """
    width = ch.tp * ch.pp * ch.cp
    p = ch.pp
    line: dict[str, tuple[float, float]] = {}
    for g, info in sorted(ctx.types.items(), key=lambda kv: kv[1].order):
        reps_g = info.num_gpus // width
        if info.gpn_gcd % ch.tp or not reps_g:
            continue
        r1, _, _ = _simulate_group(ctx, ch, g, reps_g, p)
        if not r1.feasible:
            continue
        r2, _, _ = _simulate_group(ctx, ch, g, reps_g, 2 * p)
        s1, s2 = float(r1.step_time_s or 0.0), float(r2.step_time_s or 0.0)
        alpha = (s2 - s1) / p
        line[g] = (alpha, s1 - alpha * p)
    if not line:
        return line, math.inf
    dp = int(fix["dp"]) if fix.get("dp") is not None else None
    bound = replica_bound(replica_times(ctx, ch, list(line)),
                          ctx.training.global_batch_size // ch.mbs, dp)
    return line, bound


def exact_shares(line: dict[str, tuple[float, float]], count: dict[str, int], M: int,
                 dp: int | None) -> tuple[float, dict[str, list[int]]] | None:
    """The optimum of the data ILP (:func:`solve_data`) by enumeration: (T seconds, micro-batches
    per replica of each active type, non-increasing), or None when no allocation exists.

    For a set A of active types (all replicas of each, at least one micro-batch each;
    ``dp`` pins the replica count) a replica of type g runs at most
    c_g(T) = floor((T - beta_g) / alpha_g) micro-batches by T, so the least T is the least
    line value alpha_g n + beta_g (n in 1..M, g in A) at which sum_g R_g min(M, c_g(T)) >= M
    and every c_g(T) >= 1: a binary search over those values. Over all sets A the least T
    wins (the first set in size order on ties). The allocation then takes micro-batches
    back, one at a time, from the replica whose line is highest until they sum to M, so
    replicas of one type differ by at most one. Needs every alpha_g > 0 (a replica's step
    grows with its micro-batches); the caller falls back to CBC otherwise.
    """
    types = list(line)
    best: tuple[float, tuple[str, ...]] | None = None
    n = np.arange(1, M + 1, dtype=float)

    def cap(g: str, level: float) -> int:
        """Most micro-batches a replica of type g finishes by ``level`` seconds (<= M)."""
        return min(M, math.floor((level - line[g][1]) / line[g][0] * (1 + 1e-12) + 1e-9))

    for size in range(1, len(types) + 1):
        for active in itertools.combinations(types, size):
            reps = sum(count[g] for g in active)
            if reps > M or (dp is not None and reps != dp):
                continue

            def fits(level: float, active: tuple[str, ...] = active) -> bool:
                caps = [cap(g, level) for g in active]
                return min(caps) >= 1 and sum(count[g] * c for g, c in
                                              zip(active, caps, strict=True)) >= M

            levels = np.unique(np.concatenate([line[g][0] * n + line[g][1] for g in active]))
            level = least_level(levels, fits)
            if level is None:
                continue
            if best is None or level < best[0] * (1 - 1e-12):
                best = (level, active)
    if best is None:
        return None
    level, active = best
    shares = {g: [cap(g, level)] * count[g] for g in active}
    heap = [(-(line[g][0] * k + line[g][1]), g, j) for g in active
            for j, k in enumerate(shares[g])]
    heapq.heapify(heap)
    extra = sum(sum(v) for v in shares.values()) - M
    while extra > 0:
        _, g, j = heapq.heappop(heap)
        if shares[g][j] > 1:
            shares[g][j] -= 1
            extra -= 1
            heapq.heappush(heap, (-(line[g][0] * shares[g][j] + line[g][1]), g, j))
    return level, {g: sorted(v, reverse=True) for g, v in shares.items()}


def solve_data(ctx: Ctx, ch: Choice, fix: dict[str, Any],
               line: dict[str, tuple[float, float]], time_limit_s: float,
               ) -> tuple[IlpCandidate | None, SolveRecord]:
    """The data-heterogeneous ILP of one choice, verified type by type with ``simulate``.

    ``line`` from :func:`data_inputs`. Each type takes part with all its replicas or not
    at all (whole nodes keep the gradient all-reduce's rings regular, and ZeRO shards as
    simulated). ILP: integer micro-batches n_j per replica and a binary a_g per type,
    sum_j n_j = M (micro-batches of the global batch), a_g <= n_j <= M a_g,
    T >= alpha_g n_j + beta_g a_g, minimise T (milliseconds).

    Solved by :func:`exact_shares` (the same optimum, without a CBC subprocess) when every
    alpha_g > 0, else by CBC. Verification: per type, ``simulate`` of its active replicas at
    their largest n; the gradient reduction is then re-priced over the data-parallel ranks
    of all types (:func:`_union_dp_time`).
    """
    width = ch.tp * ch.pp * ch.cp
    M = ctx.training.global_batch_size // ch.mbs
    dp = int(fix["dp"]) if fix.get("dp") is not None else None
    count = {g: ctx.types[g].num_gpus // width for g in line}
    if all(alpha > 0 for alpha, _ in line.values()):
        start = time.perf_counter()
        found = exact_shares(line, count, M, dp)
        wall = time.perf_counter() - start
        if found is None:
            return None, SolveRecord("data", ch.short(), "infeasible", None, None, None, wall,
                                     solver="enumeration")
        obj = MS * found[0]
        return _verify(ctx, ch, line, found[1],
                       SolveRecord("data", ch.short(), "optimal", obj, obj, 0.0, wall,
                                   solver="enumeration"))
    prob, shares_of = data_problem(line, count, M, dp)
    rec = solve_cbc(prob, time_limit_s, "data", ch.short())
    if rec.objective is None:
        return None, rec
    return _verify(ctx, ch, line, shares_of(), rec)


def data_problem(line: dict[str, tuple[float, float]], count: dict[str, int], M: int,
                 dp: int | None) -> tuple[pulp.LpProblem, Callable[[], dict[str, list[int]]]]:
    """The data ILP of :func:`solve_data` as a PuLP problem (milliseconds), and a function
    that reads the micro-batches per replica of each active type from its solution."""
    reps = [(g, j) for g in line for j in range(count[g])]
    prob = pulp.LpProblem("data_hetero", pulp.LpMinimize)
    nv = [lp_var(prob, f"n_{i}", 0, M, "Integer") for i in range(len(reps))]
    av = {g: lp_var(prob, f"a_{k}", cat="Binary") for k, g in enumerate(line)}
    big_t = lp_var(prob, "T", 0)
    prob += big_t
    prob += pulp.lpSum(nv) == M
    if dp is not None:
        prob += pulp.lpSum(count[g] * av[g] for g in line) == dp
    for i, (g, j) in enumerate(reps):
        alpha, beta = line[g]
        prob += nv[i] <= M * av[g]
        prob += nv[i] >= av[g]
        prob += big_t >= MS * alpha * nv[i] + MS * beta * av[g]
        if j:  # symmetry: replicas of one type in non-increasing order of micro-batches
            prob += nv[i] <= nv[i - 1]

    def shares_of() -> dict[str, list[int]]:
        shares: dict[str, list[int]] = {}
        for i, (g, _) in enumerate(reps):
            n = int(round(nv[i].varValue or 0.0))
            if n > 0:
                shares.setdefault(g, []).append(n)
        return shares
    return prob, shares_of


def _verify(ctx: Ctx, ch: Choice, line: dict[str, tuple[float, float]],
            shares: dict[str, list[int]], rec: SolveRecord
            ) -> tuple[IlpCandidate | None, SolveRecord]:
    """``simulate`` each active type at its largest share, then the all-type gradient
    reduction (:func:`solve_data`)."""
    width = ch.tp * ch.pp * ch.cp
    groups: list[DataGroup] = []
    node_groups: list[NodeGroup] = []
    union: list[int] = []
    predicted: list[float] = []
    for g in sorted(shares, key=lambda g: ctx.types[g].order):
        ns = shares[g]
        rep, plan, sub = _simulate_group(ctx, ch, g, len(ns), max(ns))
        if not rep.feasible:
            return None, rec
        offset = sum(x.num_gpus for x in node_groups)
        union += [offset + ch.tp * i for i in range(ch.cp * len(ns))]
        groups.append(DataGroup(g, len(ns), ns, sum(ns) * ch.mbs, rep, plan, sub))
        node_groups += list(sub.node_groups)
        predicted.append(line[g][0] * max(ns) + line[g][1])
    combined = assemble(ctx.cluster, node_groups, "data")
    # Every replica waits for the one all-reduce, which the last type to finish its
    # backward gates: the step is that type's compute plus the exposure its window leaves.
    pre = [float(gr.report.step_time_s or 0.0) - gr.report.time_s.get("dp_comm", 0.0)
           for gr in groups]
    slow = max(range(len(groups)), key=lambda i: pre[i])
    dp_time = _union_dp_time(ctx, groups[slow], combined, tuple(union))
    report, plan = _compose(ctx, ch, groups, combined, pre, slow, dp_time)
    idle = {g: t.num_gpus - len(shares.get(g, [])) * width for g, t in ctx.types.items()}
    report.extra["idle_gpus"] = idle
    cand = IlpCandidate("data", report, plan, combined, [gr.gpu for gr in groups], predicted,
                        max(predicted), idle, rec, groups)
    return cand, rec
