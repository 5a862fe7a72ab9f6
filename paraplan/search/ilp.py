"""ILP searchers for heterogeneous clusters (several GPU types), solved with PuLP + CBC.

Two formulations, each solved once per *structural choice* (tp, dp, pp, micro-batch size,
recompute, ZeRO stage; schedule 1F1B; sequence parallelism whenever tp > 1) in an outer
loop; the better verified plan wins and the result says which.

* **Pipeline-heterogeneous** (``formulation="pipeline"``): every pipeline stage is a block of
  dp*tp*cp GPUs of ONE GPU type; the ILP chooses the type of each ordered stage position
  (binary ``y[k,g]``) and the integer layer split (``l[k,g] <= Lmax[k,g] * y[k,g]``, which
  both linearises "layers x type" and carries the memory limit) within the GPUs of each
  type; each type hosts one contiguous run of stages. Stages on different GPU types with
  an uneven layer partition balanced by speed and memory follow Metis (Um et al. 2024,
  "Metis: Fast Automatic Distributed Training on Heterogeneous GPUs"). The objective is
  AMP's pipeline latency ``(m - 1) * max_k t_k + sum_k t_k`` (Li et al. 2022, "AMP:
  Automatically Finding Model Parallel Strategies with Heterogeneity Awareness", its
  ``pipe_cost``: (B - 1) x the slowest stage + the sum of the stages) with ``simulate``'s
  per-op transfer added to every stage: the bottleneck stage time weighted by the m - 1
  steady-state micro-batches plus the fill/drain. On a homogeneous cluster the sum is
  fixed and it minimises the bottleneck alone.
* **Data-heterogeneous** (``formulation="data"``): every data-parallel replica is a whole
  pipeline on GPUs of one type (HetPipe's "virtual workers", Park et al. 2020) and
  replicas get unequal integer numbers of micro-batches of the global batch (hardware-
  aware batch shares as in Whale, Jia et al. 2022); an ILP over per-replica micro-batch
  counts minimises the slowest replica's step ``alpha_g n + beta_g``. ``simulate`` runs one
  batch size per plan, so such a plan is verified per GPU type (``simulate`` of its
  replicas) and its step is the last type's compute plus the gradient all-reduce over
  all types, priced by ``simulate``'s own rule (:func:`_union_dp_time`).

Costs are the simulator's own: per-layer forward + backward seconds from
``simulator.step.layer_cost`` on ``Device.of(gpu, precision, kernels)`` (exposed TP/CP/EP
communication and recomputation included), the LM head from ``step.head_times``,
and per-stage peak memory (bytes) from ``memory.pipeline_memory`` with 1F1B's in-flight
micro-batches ``min(p - k, m)`` on stage k (Narayanan et al. 2021 sec 2.2), compared with
each GPU type's ``memory_GiB`` (GiB = 2^30 bytes) as ``simulate`` compares them. Every
plan is verified with ``simulate`` - pipeline plans on the cluster they actually use (node
groups reordered and trimmed so that stage k's ranks land on its GPU type) - and plans
are ranked by simulated ``step_time_s``. Inside the ILPs times are milliseconds (better
conditioned); everything returned is seconds.

Search: best-first over the structural choices by a lower bound on the simulated step
(compute-only at first, then refined with the memory limits, integer layers and the
1F1B fill, :func:`_span_bound`); a choice is solved only while its bound is below the
incumbent (the best simulated step so far), so most are never solved.

Pure functions: nothing is cached across calls; CBC runs as a subprocess per solve.
"""

from __future__ import annotations

import heapq
import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pulp
from scipy.optimize import linear_sum_assignment

from paraplan.search.space import CONSTANT_FIELDS, RECOMPUTES, parse_fix
from paraplan.simulator import collectives as coll
from paraplan.simulator.compute import Device
from paraplan.simulator.flops import hardware_flops_per_step, model_flops_per_step
from paraplan.simulator.memory import (
    DDP_BUCKET_ELEMENTS,
    GiB,
    LayerActivations,
    layer_activations,
    params_per_stage,
    pipeline_memory,
)
from paraplan.simulator.pipeline import inflight_microbatches
from paraplan.simulator.step import (
    StepReport,
    bucketed_grad_sync,
    even_split,
    head_times,
    layer_cost,
    simulate,
)
from paraplan.specs.checks import check_plan, divisors
from paraplan.specs.cluster import ClusterSpec, GPUSpec, NodeGroup
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ALIASES, ParallelPlan
from paraplan.specs.training import TrainingSpec

FORMULATIONS: tuple[str, ...] = ("pipeline", "data")
CP_DEGREES = (1, 2, 4, 8)
"""Context-parallel degrees enumerated (pin another with ``fix``)."""
MAX_MICRO_BATCH = 16
"""Largest micro-batch size enumerated (pin a larger one with ``fix``)."""
MS = 1e3
"""ILP time unit: coefficients are milliseconds (seconds x 1e3)."""
MIN_SOLVE_S = 1.0
"""Smallest CBC time limit handed to one solve, seconds."""
_FIXABLE = ("tp", "pp", "dp", "cp", "ep", "etp", "sequence_parallel", "zero_stage",
            "micro_batch_size", "schedule", "virtual_stages", "recompute", *CONSTANT_FIELDS)


# ---- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SolveRecord:
    """One CBC solve: what it was, how it ended, how long it took."""

    formulation: str
    """``pipeline`` or ``data``."""
    choice: str
    """The structural choice solved (``ParallelPlan.short()`` form)."""
    status: str
    """``optimal``, ``time_limit`` (a solution, not proven optimal), ``infeasible``,
    ``cutoff`` (no solution can beat the incumbent plan) or ``no_solution`` (time ran out
    before any)."""
    objective: float | None
    """CBC's objective, milliseconds (None without a solution)."""
    bound: float | None
    """CBC's best lower bound, milliseconds (equals the objective when optimal)."""
    gap: float | None
    """(objective - bound) / objective; 0 when optimal, None without a solution."""
    time_s: float
    """Wall-clock seconds of the CBC subprocess (model write + solve + read back)."""


@dataclass(frozen=True)
class PipelineSolution:
    """The pipeline-heterogeneous ILP's answer for one structural choice."""

    plan: ParallelPlan
    """The structural choice with ``layers_per_stage`` (and ``dp``) set."""
    cluster: ClusterSpec
    """The cluster actually used: node groups reordered/trimmed so that stage k's ranks
    [k*dp*tp*cp, (k+1)*dp*tp*cp) are GPUs of ``stage_gpu_types[k]``."""
    stage_gpu_types: list[str]
    """GPU type of each pipeline stage, first stage first."""
    layers_per_stage: list[int]
    """Transformer layers per stage."""
    stage_times_s: list[float]
    """Forward + backward seconds of one micro-batch on each stage (LM head on the last),
    the ILP's cost model evaluated at its integer solution."""
    stage_memory_gb: list[float]
    """Peak memory of one rank of every stage, GiB (2^30 bytes)."""
    bottleneck_s: float
    """max(stage_times_s), seconds."""
    p2p_s: float
    """The transfer ``simulate`` charges after every forward/backward op, seconds."""
    objective_s: float
    """(m - 1)(bottleneck + 2 p2p) + sum_k (stage_times_s[k] + 2 p2p), seconds (AMP's
    pipeline latency with the transfers)."""
    idle_gpus: dict[str, int]
    """GPUs of each type the plan leaves unused."""
    solve: SolveRecord


@dataclass(frozen=True)
class DataGroup:
    """The active replicas of one GPU type in a data-heterogeneous plan."""

    gpu: str
    replicas: int
    microbatches_per_replica: list[int]
    """Micro-batches each replica runs (they differ by at most a few)."""
    global_batch: int
    """Sequences this type processes per step (sum of micro-batches x mbs)."""
    report: StepReport
    """``simulate`` of these replicas alone, each at the largest micro-batch count (the
    type's slowest replica; its data-parallel reduction only over this type)."""
    plan: ParallelPlan
    cluster: ClusterSpec


@dataclass(frozen=True)
class IlpCandidate:
    """One verified plan of either formulation."""

    formulation: str
    report: StepReport
    """``simulate``'s report (pipeline) or the composed report of the groups (data)."""
    plan: ParallelPlan
    cluster: ClusterSpec
    stage_gpu_types: list[str]
    """Pipeline: the GPU type of each stage. Data: the GPU type of each replica group."""
    ilp_stage_times_s: list[float]
    """Pipeline: forward + backward seconds of one micro-batch per stage. Data: each group's
    predicted step seconds (alpha_g * n + beta_g)."""
    ilp_objective_s: float
    """The ILP objective at its solution, seconds."""
    idle_gpus: dict[str, int]
    solve: SolveRecord
    groups: list[DataGroup] = field(default_factory=list)
    """Data formulation only: the replica groups."""

    @property
    def step_time_s(self) -> float:
        return float(self.report.step_time_s or math.inf)


@dataclass(frozen=True)
class IlpResult:
    """Best plans of the heterogeneous ILP search, best (lowest simulated step time) first."""

    reports: list[StepReport]
    plans: list[ParallelPlan]
    clusters: list[ClusterSpec]
    """The (reordered, trimmed) cluster each plan runs on."""
    formulation: str
    """Formulation of the best plan: ``pipeline`` or ``data``."""
    solver_status: str
    """Status of the solve that produced the best plan (see SolveRecord.status)."""
    gap: float
    """Optimality gap of that solve (0 when optimal)."""
    solve_time_s: float
    """Total CBC wall-clock seconds over every solve."""
    plans_evaluated: int
    """Number of ILP solves."""
    baseline_step_time_s: float | None
    """Best step time of an even-split plan on the original rank order (each stage paced by
    its slowest GPU, i.e. all GPUs treated as the slowest type), seconds; None if none fits."""
    baseline_plan: ParallelPlan | None
    candidates: list[IlpCandidate]
    """Everything per plan (aligned with reports/plans/clusters)."""
    solves: list[SolveRecord]
    """Every solve in order."""
    choices: int
    """Structural choices enumerated (both formulations)."""
    pruned: int
    """Choices never solved because a lower bound on their step time could not beat the
    incumbent (the best simulated plan so far)."""
    complete: bool
    """False when ``time_limit_s`` ran out before every choice was solved or pruned."""
    search_time_s: float

    @property
    def step_time_s(self) -> float:
        return float(self.reports[0].step_time_s or math.inf)

    @property
    def speedup_vs_baseline(self) -> float | None:
        """baseline_step_time_s / best step time (> 1 means the ILP plan is faster)."""
        if self.baseline_step_time_s is None:
            return None
        return self.baseline_step_time_s / self.step_time_s


# ---- per-search context --------------------------------------------------------------------


@dataclass(frozen=True)
class _GpuType:
    name: str
    gpu: GPUSpec
    num_gpus: int
    gpn_gcd: int
    """gcd of gpus_per_node over this type's node groups (TP must divide it)."""
    order: int


@dataclass
class _Ctx:
    """Inputs and memo tables of one search (a local object, never shared across calls)."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    constants: dict[str, Any]
    types: dict[str, _GpuType]
    costs: dict[tuple, tuple[float, float, float, float]] = field(default_factory=dict)
    probes: dict[str, ClusterSpec] = field(default_factory=dict)
    probes_p2p: dict[tuple, Any] = field(default_factory=dict)
    acts: dict[tuple, LayerActivations] = field(default_factory=dict)


@dataclass(frozen=True)
class _Choice:
    formulation: str
    tp: int
    dp: int
    pp: int
    cp: int
    mbs: int
    recompute: str
    zero: int
    sp: bool
    extra: tuple[tuple[str, Any], ...]
    """ep/etp when pinned."""

    def plan(self, constants: dict[str, Any], **update: Any) -> ParallelPlan:
        data: dict[str, Any] = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp,
                                "micro_batch_size": self.mbs, "recompute": self.recompute,
                                "zero_stage": self.zero, "sequence_parallel": self.sp,
                                "schedule": "1f1b", **dict(self.extra), **constants}
        data.update(update)
        return ParallelPlan(**data)

    def short(self) -> str:
        rep = "dp=replicas" if self.formulation == "data" else f"dp={self.dp}"
        sp = " sp" if self.sp else ""
        return (f"tp={self.tp} pp={self.pp} {rep}{' cp=' + str(self.cp) if self.cp > 1 else ''}"
                f"{sp} zero={self.zero} mbs={self.mbs} rc={self.recompute}")


def _context(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
             constants: dict[str, Any]) -> _Ctx:
    types: dict[str, _GpuType] = {}
    for g in cluster.node_groups:
        if training.precision not in g.gpu.peak_tflops:
            raise SpecError(
                f"precision={training.precision} is not supported by {g.gpu.name} (it has "
                f"{', '.join(sorted(g.gpu.peak_tflops))}); pick a precision every GPU type has",
                field="training.precision", value=training.precision,
                allowed=sorted(g.gpu.peak_tflops))
        prev = types.get(g.gpu.name)
        if prev is None:
            types[g.gpu.name] = _GpuType(g.gpu.name, g.gpu, g.num_gpus, g.gpus_per_node,
                                         len(types))
        else:
            types[g.gpu.name] = _GpuType(g.gpu.name, prev.gpu, prev.num_gpus + g.num_gpus,
                                         math.gcd(prev.gpn_gcd, g.gpus_per_node), prev.order)
    return _Ctx(model, cluster, training, constants, types)


def _rebuild(cluster: ClusterSpec, **update: Any) -> ClusterSpec:
    """A new ClusterSpec with fields replaced. Built through the constructor, not
    ``model_copy``: the copy would inherit the original's cached ``topology``."""
    data = {name: getattr(cluster, name) for name in ClusterSpec.model_fields}
    data.update(update)
    return ClusterSpec(**data)


def _probe(ctx: _Ctx, first: str) -> ClusterSpec:
    """The cluster with GPU type ``first``'s node groups moved to the front.

    ``simulate`` prices TP/CP/EP collectives on the first group of ranks of the cluster it
    is given (ranks 0..tp-1), so on a reordered cluster they run over the links of the type
    that hosts stage 0; per-layer costs are computed on this probe to agree with it.
    """
    hit = ctx.probes.get(first)
    if hit is None:
        groups = ([g for g in ctx.cluster.node_groups if g.gpu.name == first]
                  + [g for g in ctx.cluster.node_groups if g.gpu.name != first])
        hit = ctx.probes[first] = _rebuild(ctx.cluster, node_groups=groups)
    return hit


def _layer_costs(ctx: _Ctx, plan: ParallelPlan, first: str,
                 gpu: str) -> tuple[float, float, float, float]:
    """(forward, backward, LM-head forward, LM-head backward) seconds of one layer / one
    micro-batch on GPU type ``gpu`` when type ``first`` hosts stage 0 (``layer_cost``)."""
    key = (plan.tp, plan.cp, plan.ep, plan.etp, plan.sequence_parallel, plan.micro_batch_size,
           plan.recompute, plan.tp_comm_overlap, first, gpu)
    hit = ctx.costs.get(key)
    if hit is None:
        dev = Device.of(ctx.types[gpu].gpu, ctx.training.precision, ctx.training.kernels)
        # simulate prices each stage's TP/CP/EP groups on its own GPU type's links, so the
        # cost of type ``gpu`` no longer depends on which type hosts stage 0.
        topo = _probe(ctx, gpu).topology
        cost = layer_cost(ctx.model, topo, ctx.training, plan, dev, moe=ctx.model.is_moe)
        head = head_times(ctx.model, topo, ctx.training, plan, dev)
        hit = ctx.costs[key] = (cost.fwd, cost.bwd, head.fwd, head.bwd)
    return hit


def _stage_time(costs: tuple[float, float, float, float], layers: int, last: bool) -> float:
    """Forward + backward seconds of a stage (``simulate``'s arithmetic and order)."""
    fwd, bwd, head_f, head_b = costs
    f, b = layers * fwd, layers * bwd
    if last:
        f, b = f + head_f, b + head_b
    return f + b


def _activations(ctx: _Ctx, plan: ParallelPlan) -> LayerActivations:
    key = (plan.tp, plan.cp, plan.ep, plan.etp, plan.sequence_parallel, plan.micro_batch_size,
           plan.recompute)
    hit = ctx.acts.get(key)
    if hit is None:
        hit = ctx.acts[key] = layer_activations(ctx.model, ctx.training, plan)
    return hit


# ---- structural choices ----------------------------------------------------------------------


def _normalise_fix(fix: dict[str, Any] | None) -> dict[str, Any]:
    """``fix`` with short names (mbs, rc, zero, sp, ...) expanded and values validated."""
    raw = parse_fix({ALIASES.get(str(k), str(k)): v for k, v in fix.items()}) if fix else {}
    for key in raw:
        if key not in _FIXABLE:
            raise SpecError(f"fix cannot pin {key!r} in the ILP search", field="fix",
                            value=key, allowed=list(_FIXABLE))
    if raw.get("schedule", "1f1b") != "1f1b":
        raise SpecError(f"fix schedule={raw['schedule']!r}: the ILP search models 1F1B "
                        "(its in-flight memory min(p-k, m)); pin schedule=1f1b or leave it out",
                        field="fix.schedule", value=raw["schedule"], allowed=["1f1b"])
    if raw.get("virtual_stages", 1) != 1:
        raise SpecError("fix virtual_stages must be 1: the ILP places whole stages",
                        field="fix.virtual_stages", value=raw["virtual_stages"], allowed=[1])
    if raw.get("allow_cross_node_tp"):
        raise SpecError("fix allow_cross_node_tp=true is not supported by the ILP search "
                        "(stages are laid out node by node)", field="fix.allow_cross_node_tp",
                        value=True, allowed=[False])
    if raw.get("recompute") is not None and raw["recompute"] not in RECOMPUTES:
        raise SpecError(f"unknown recompute {raw['recompute']!r}", field="fix.recompute",
                        value=raw["recompute"], allowed=list(RECOMPUTES))
    return raw


def _pick(fix: dict[str, Any], key: str, values: Sequence[Any]) -> list[Any]:
    if fix.get(key) is not None:
        return [fix[key]]
    return list(values)


def _tp_ok(model: ModelSpec, tp: int) -> bool:
    return not (model.num_attention_heads % tp or model.kv_heads % tp
                or model.ffn_hidden_size % tp)


def _zero_stages(fix: dict[str, Any], dp: int) -> list[int]:
    """ZeRO stages worth solving for ``dp`` replicas.

    ZeRO-1 and -2 move the same bytes as an all-reduce (reduce-scatter + all-gather;
    Rajbhandari et al. 2020, "ZeRO", communication analysis) and ``simulate`` prices them
    alike, while they shard more memory and shorten the optimizer step: ZeRO-2 dominates 0
    and 1. With dp = 1 nothing is sharded, so only ZeRO-0 is kept. ``fix`` overrides.
    """
    if fix.get("zero_stage") is not None:
        return [int(fix["zero_stage"])]
    return [2, 3] if dp > 1 else [0]


def _recomputes(ctx: _Ctx, fix: dict[str, Any], base: ParallelPlan) -> list[str]:
    """Recompute modes not dominated by another (no more activation bytes per layer and no
    more seconds per layer on any GPU type); e.g. ``selective`` with flash attention keeps
    what ``none`` keeps and re-runs attention."""
    if fix.get("recompute") is not None:
        return [fix["recompute"]]
    stats = {}
    for rc in RECOMPUTES:
        plan = base.model_copy(update={"recompute": rc})
        la = _activations(ctx, plan)
        times = tuple(sum(_layer_costs(ctx, plan, h, g)[:2]) for h in ctx.types
                      for g in ctx.types)
        stats[rc] = ((la.dense, la.moe, la.working), times)
    keep = []
    for rc in RECOMPUTES:
        mem, times = stats[rc]
        dominated = False
        for other in RECOMPUTES:
            if other == rc:
                continue
            m2, t2 = stats[other]
            no_worse = all(a <= b for a, b in zip(m2, mem, strict=True)) and all(
                a <= b for a, b in zip(t2, times, strict=True))
            # Equal modes: keep the first (RECOMPUTES order).
            if no_worse and ((m2, t2) != (mem, times)
                             or RECOMPUTES.index(other) < RECOMPUTES.index(rc)):
                dominated = True
                break
        if not dominated:
            keep.append(rc)
    return keep


def _enumerate(ctx: _Ctx, fix: dict[str, Any]) -> list[_Choice]:
    """Every structural choice of both formulations that passes the cheap legality rules."""
    model, training = ctx.model, ctx.training
    L, B = model.num_layers, training.global_batch_size
    n_total = ctx.cluster.num_gpus
    gpn_all = [t.gpn_gcd for t in ctx.types.values()]
    tps = [t for t in _pick(fix, "tp", divisors(max(gpn_all))) if _tp_ok(model, t)]
    mixed = len(ctx.types) > 1
    # Context parallelism is enumerated on one GPU type (the homogeneous cross-check); on a
    # mixed cluster only when pinned (the per-type verification clusters can be smaller than
    # a CP ring).
    cps = [c for c in _pick(fix, "cp", (1,) if mixed else CP_DEGREES)
           if c == 1 or (training.seq_len % (2 * c) == 0 and c * max(gpn_all) <= n_total)]
    extra = tuple((k, fix[k]) for k in ("ep", "etp") if fix.get(k) is not None)
    out: list[_Choice] = []
    for tp in tps:
        sps = _pick(fix, "sequence_parallel", [tp > 1])
        if tp == 1 and any(sps):
            continue
        for cp in cps:
            for sp in sps:
                base = ParallelPlan(tp=tp, cp=cp, sequence_parallel=sp,
                                    **dict(extra), **ctx.constants)
                for mbs in _pick(fix, "micro_batch_size",
                                 [b for b in divisors(B) if b <= MAX_MICRO_BATCH]):
                    if B % mbs:
                        continue
                    rcs = _recomputes(ctx, fix, base.model_copy(update={"micro_batch_size": mbs}))
                    # Pipeline-heterogeneous: dp*tp*cp GPUs of one type per stage.
                    for dp in _pick(fix, "dp", divisors(B // mbs)):
                        if B % (dp * mbs):
                            continue
                        span = dp * tp * cp
                        stages = sum(t.num_gpus // span for t in ctx.types.values()
                                     if t.gpn_gcd % tp == 0)
                        for pp in _pick(fix, "pp", range(1, min(L, stages) + 1)):
                            if pp > L or pp > stages or span * pp > n_total:
                                continue
                            for rc in rcs:
                                for z in _zero_stages(fix, dp):
                                    out.append(_Choice("pipeline", tp, dp, pp, cp, mbs, rc, z,
                                                       sp, extra))
                    if not mixed:
                        continue
                    # Data-heterogeneous: replicas of tp*pp*cp GPUs of one type.
                    for pp in _pick(fix, "pp", range(1, L + 1)):
                        width = tp * pp * cp
                        replicas = sum(t.num_gpus // width for t in ctx.types.values()
                                       if t.gpn_gcd % tp == 0)
                        if replicas < 1 or pp > L:
                            continue
                        if fix.get("dp") is not None and fix["dp"] > replicas:
                            continue
                        for rc in rcs:
                            # ZeRO-3's per-micro-batch gathers are not re-priced across
                            # types (see _union_dp_time), so replicas use ZeRO <= 2.
                            for z in [z for z in _zero_stages(fix, 2) if z < 3]:
                                out.append(_Choice("data", tp, 0, pp, cp, mbs, rc, z, sp,
                                                   extra))
    return out


# ---- lower bounds --------------------------------------------------------------------------------


def _span_bound(m: int, p: int, bottleneck: float, total: float, last_min: float,
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


def _shares(costs: Sequence[tuple[float, float, float, float]]) -> tuple[float, float]:
    """Least forward and least backward share of a stage's time over these costs."""
    fwd = min(min(f / (f + b), hf / (hf + hb)) for f, b, hf, hb in costs)
    bwd = min(min(b / (f + b), hb / (hf + hb)) for f, b, hf, hb in costs)
    return fwd, bwd


def _pipeline_bound(ctx: _Ctx, ch: _Choice) -> float:
    """Compute-only lower bound on the step time of any plan of choice ``ch``, seconds.

    The slowest of p stages takes T >= (L + min_g head_g/c_g) / sum_k 1/c_k (fractional
    layers; c_k per-layer seconds of stage k's type, best over which type leads, on the p
    fastest stages the GPU counts allow); the span then follows :func:`_span_bound`
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
        costs = [_layer_costs(ctx, plan, h, g) for h in ctx.types]
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
    return _span_bound(m, ch.pp, t_lb, total, min(c + h for c, _, h in per), 0.0,
                       *_shares(every))


def _replica_times(ctx: _Ctx, ch: _Choice, types: Sequence[str],
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
        costs = _layer_costs(ctx, plan, g, g)
        t = np.array([_stage_time(costs, split[r], r == ch.pp - 1) for r in range(ch.pp)])
        out[g] = (t, np.concatenate([[0.0], np.cumsum(t)[:-1]]), info.num_gpus // width)
    return out


def _replica_bound(times: dict[str, tuple[np.ndarray, np.ndarray, int]], microbatches: int,
                   replicas: int | None = None) -> float:
    """Lower bound on the slowest replica's step when replicas share ``microbatches``,
    seconds: a replica of type g running n micro-batches spans at least
    max_k (n t_k + sum_{j<k} t_j) (:func:`_span_bound`'s argument on its own pipeline), so
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

    if not fits(float(levels[-1])):
        return math.inf
    lo, hi = 0, len(levels) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(float(levels[mid])):
            hi = mid
        else:
            lo = mid + 1
    return float(levels[lo])


def _data_bound(ctx: _Ctx, ch: _Choice, fix: dict[str, Any]) -> float:
    """Compute-only lower bound for the data-heterogeneous choice, seconds
    (:func:`_replica_bound` over every GPU type)."""
    dp = int(fix["dp"]) if fix.get("dp") is not None else None
    return _replica_bound(_replica_times(ctx, ch, list(ctx.types)),
                          ctx.training.global_batch_size // ch.mbs, dp)


# ---- memory -------------------------------------------------------------------------------


def _layer_limits(ctx: _Ctx, plan: ParallelPlan, m: int,
                  types: Sequence[str]) -> tuple[list[dict[str, int]], list[list[float]]]:
    """Largest layer count each stage position can hold on each GPU type.

    Returns (``lmax[k][g]`` in 0..L-p+1, 0 = not even one layer fits; ``peaks[l][k]`` the peak
    GiB of stage k holding l layers). Exact: a stage's peak (``pipeline_memory``) is
    non-decreasing in its layer count, so "fits" is an interval [1, lmax]; the DDP bucket
    term min(params, 40M elements) x 4 B makes the peak piecewise-linear in the layers, which
    is why it enters the ILP as this bound and not as one linear row.
    """
    p, L = plan.pp, ctx.model.num_layers
    la = _activations(ctx, plan)
    inflight = [inflight_microbatches("1f1b", p, m, k) for k in range(p)]
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


# ---- CBC ----------------------------------------------------------------------------------

_BOUND_RE = re.compile(r"(?:Lower bound|best possible)[:\s]+(-?[0-9.eE+]+)")


def _var(prob: pulp.LpProblem, name: str, low: float | None = None, up: float | None = None,
         cat: str = "Continuous") -> pulp.LpVariable:
    """A variable of ``prob`` (PuLP >= 3.3's ``add_variable``; ``LpVariable`` before)."""
    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, low, up, cat=cat)
    return pulp.LpVariable(name, low, up, cat=cat)  # pragma: no cover - old PuLP


def _cbc(prob: pulp.LpProblem, time_limit_s: float, formulation: str,
         choice: str) -> SolveRecord:
    """Solve ``prob`` with CBC (subprocess) and read status, objective, bound and gap."""
    with tempfile.TemporaryDirectory(prefix="paraplan-ilp-") as tmp:
        log = os.path.join(tmp, "cbc.log")
        start = time.perf_counter()
        with warnings.catch_warnings():  # PuLP 3.3 flags PULP_CBC_CMD for its 4.0
            warnings.simplefilter("ignore", DeprecationWarning)
            # Root cuts mostly re-derive the fluid bound here; off, CBC is 3-5x faster.
            solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(MIN_SOLVE_S, time_limit_s),
                                       logPath=log, cuts=False)
            prob.solve(solver)
        wall = time.perf_counter() - start
        try:
            with open(log, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            text = ""
    stopped = "Stopped on time" in text or "Stopped on iteration" in text
    has_solution = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if prob.status == pulp.LpStatusInfeasible or "infeasible" in text.split("Result -")[-1][:80]:
        return SolveRecord(formulation, choice, "infeasible", None, None, None, wall)
    if not has_solution:
        return SolveRecord(formulation, choice, "no_solution", None, None, None, wall)
    obj = float(pulp.value(prob.objective) or 0.0)
    if prob.sol_status == pulp.LpSolutionOptimal and not stopped:
        return SolveRecord(formulation, choice, "optimal", obj, obj, 0.0, wall)
    found = _BOUND_RE.findall(text)
    bound = float(found[-1]) if found else None
    gap = None if bound is None else max(0.0, (obj - bound) / abs(obj) if obj else 0.0)
    return SolveRecord(formulation, choice, "time_limit", obj, bound, gap, wall)


# ---- clusters actually used ---------------------------------------------------------------------


def _take(cluster: ClusterSpec, gpu: str, start: int, count: int) -> list[NodeGroup]:
    """Node groups holding GPUs [start, start+count) of type ``gpu`` (its groups in cluster
    order, node by node). A partly used node becomes a one-node group of the GPUs used with
    its share of the node's NICs rounded up, so no GPU gets less NIC bandwidth than in a
    full node (idle GPUs do not load the network)."""
    out: list[NodeGroup] = []
    pos = 0
    end = start + count
    for g in cluster.node_groups:
        if g.gpu.name != gpu:
            continue
        lo, hi = max(start, pos), min(end, pos + g.num_gpus)
        gpn = g.gpus_per_node
        a = lo - pos
        b = hi - pos
        while a < b:
            node_end = (a // gpn + 1) * gpn
            if a % gpn == 0 and b - a >= gpn:
                full = (b - a) // gpn
                out.append(g.model_copy(update={"num_nodes": full}))
                a += full * gpn
                continue
            k = min(node_end, b) - a
            nics = max(1, -(-g.nics_per_node * k // gpn))
            out.append(g.model_copy(update={"gpus_per_node": k, "num_nodes": 1,
                                            "nics_per_node": nics}))
            a += k
        pos += g.num_gpus
    return out


def _assemble(cluster: ClusterSpec, groups: list[NodeGroup], suffix: str) -> ClusterSpec:
    regions = {g.region for g in groups}
    links = [r for r in cluster.region_links if r.a in regions and r.b in regions]
    return _rebuild(cluster, name=f"{cluster.name}-{suffix}", node_groups=groups,
                    region_links=links)


def pipeline_cluster(cluster: ClusterSpec, stage_gpu_types: Sequence[str],
                     gpus_per_stage: int) -> ClusterSpec:
    """The cluster a pipeline-heterogeneous plan runs on: for each run of consecutive stages
    on one GPU type, that many GPUs of the type (its node groups in cluster order), so that
    stage k's ranks [k*gpus_per_stage, (k+1)*gpus_per_stage) are all ``stage_gpu_types[k]``.

    Raises:
        SpecError: a type appears in two separate runs, or the cluster lacks the GPUs.
    """
    runs: list[tuple[str, int]] = []
    for g in stage_gpu_types:
        if runs and runs[-1][0] == g:
            runs[-1] = (g, runs[-1][1] + 1)
        else:
            runs.append((g, 1))
    seen = [g for g, _ in runs]
    if len(seen) != len(set(seen)):
        raise SpecError(f"stage GPU types {list(stage_gpu_types)} use a type in two separate "
                        "runs; each type must host consecutive stages", field="stage_gpu_types",
                        value=list(stage_gpu_types))
    groups: list[NodeGroup] = []
    for g, n in runs:
        have = sum(x.num_gpus for x in cluster.node_groups if x.gpu.name == g)
        if n * gpus_per_stage > have:
            raise SpecError(f"{n} stages of {gpus_per_stage} GPUs need {n * gpus_per_stage} "
                            f"{g} GPUs; the cluster has {have}", field="stage_gpu_types",
                            value=g)
        groups += _take(cluster, g, 0, n * gpus_per_stage)
    return _assemble(cluster, groups, "ilp")


# ---- pipeline-heterogeneous ILP ----------------------------------------------------------------


@dataclass(frozen=True)
class _PipeInputs:
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


def _p2p_table(ctx: _Ctx, types: Sequence[str], cap: dict[str, int], plan: ParallelPlan,
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


def _pipeline_inputs(ctx: _Ctx, ch: _Choice) -> _PipeInputs:
    """Layer limits, costs and the refined lower bound of one pipeline choice."""
    L, p = ctx.model.num_layers, ch.pp
    span = ch.dp * ch.tp * ch.cp
    m = ctx.training.global_batch_size // (ch.dp * ch.mbs)
    plan = ch.plan(ctx.constants)
    cap = {g: t.num_gpus // span for g, t in ctx.types.items()
           if t.gpn_gcd % ch.tp == 0 and t.num_gpus // span > 0}
    types = list(cap)
    lmax, peaks = _layer_limits(ctx, plan, m, types)
    best = [max(lmax[k].values(), default=0) for k in range(p)]
    share = min(1.0, sum(best) / L)
    costs = {(h, g): _layer_costs(ctx, plan, h, g) for h in types for g in types}
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
            shares = _shares(list(costs.values()))
            best_lmax = {g: sorted((row[g] for row in lmax), reverse=True)[:cap[g]]
                         for g in types}
            floor_total = _least_total(math.inf, c, best_lmax, L, head_min)
            # The true bottleneck V >= t_lb is unknown: the bound is the least over the
            # levels V of the bound at V (the sum of stage times shrinks as V grows, the
            # rest grows; stop once even the least sum cannot bring it lower).
            for v in _levels(c, head, L):
                if v < t_lb:
                    continue
                if _span_bound(m, p, v, floor_total, last_min, p2p, *shares) >= bound:
                    break
                bound = min(bound, _span_bound(
                    m, p, v, _least_total(v, c, best_lmax, L, head_min), last_min, p2p,
                    *shares))
    return _PipeInputs(plan, p, m, span, types, cap, lmax, peaks, costs, L, share,
                       bound, p2p, p2p_table)


def _pipeline_ilp(inp: _PipeInputs, time_limit_s: float, choice: str,
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
    :func:`_span_bound`'s bounds as rows (m (T + 2P) <= cutoff, and the 1F1B fill bound);
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
    y = {kg: _var(prob, f"y_{kg[0]}_{types.index(kg[1])}", cat="Binary") for kg in cells}
    lv = {kg: _var(prob, f"l_{kg[0]}_{types.index(kg[1])}", 0, lmax[kg[0]][kg[1]], "Integer")
          for kg in cells}
    big_t = _var(prob, "T", 0)
    t = [_var(prob, f"t_{k}", 0) for k in range(p)]
    # simulate's one transfer per op at the slowest stage boundary: P >= the cost of every
    # boundary k -> k+1, whose type pair is w_k[h,h2] = y[k,h] AND y[k+1,h2].
    p2p: Any = 0.0
    if p > 1:
        # w[h,h2] = 1 when some boundary k has stage k on h and stage k+1 on h2; P is at
        # least the cost of every pair that occurs.
        p2p = _var(prob, "P", 0)
        for hh, cost in inp.p2p_table.items():
            ks = [k for k in range(p - 1) if (k, hh[0]) in y and (k + 1, hh[1]) in y]
            if not ks:
                continue
            var = _var(prob, f"w_{types.index(hh[0])}_{types.index(hh[1])}", 0, 1)
            for k in ks:
                prob += var >= y[k, hh[0]] + y[k + 1, hh[1]] - 1
            prob += p2p >= MS * cost * var
    prob += (inp.m - 1) * big_t + pulp.lpSum(t) + 2.0 * (inp.m - 1 + p) * p2p
    if math.isfinite(cutoff_s):  # the step bounds of _span_bound must stay below it
        m = inp.m
        fwd, bwd = _shares(list(costs.values()))
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
            z = [_var(prob, f"z_{k}_{types.index(g)}", 0, 1) for k in range(p)]
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
        lc = {(k, g, i): _var(prob, f"lc_{k}_{types.index(g)}_{i}", 0)
              for (k, g) in cells for i in lead}
        for (k, g) in cells:
            prob += pulp.lpSum(lc[k, g, i] for i in lead) == lv[k, g]
            for i in lead:
                prob += lc[k, g, i] <= lmax[k][g] * lead[i]
        hv = {}
        for g in types:
            if (p - 1, g) in y:
                for i in lead:
                    hv[g, i] = _var(prob, f"h_{types.index(g)}_{i}", 0)
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

    rec = _cbc(prob, time_limit_s, "pipeline", choice)
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


def _pipeline_solution(ctx: _Ctx, inp: _PipeInputs, stage_types: list[str],
                       layers: list[int], rec: SolveRecord) -> PipelineSolution:
    """The ILP's integer answer evaluated in seconds/GiB and laid out on a cluster."""
    p = inp.p
    lead = stage_types[0]
    times = [_stage_time(inp.costs[lead, stage_types[k]], layers[k], k == p - 1)
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
    ctx = _context(model, cluster, training, constants)
    extra = tuple((k, getattr(plan, k)) for k in ("ep", "etp")
                  if getattr(plan, k) not in (None, 1))
    ch = _Choice("pipeline", plan.tp, plan.dp, plan.pp, plan.cp, plan.micro_batch_size,
                 plan.recompute, plan.zero_stage, plan.sequence_parallel, extra)
    if training.global_batch_size % (plan.dp * plan.micro_batch_size):
        raise SpecError(f"global_batch_size={training.global_batch_size} is not divisible by "
                        f"dp*micro_batch_size={plan.dp * plan.micro_batch_size}",
                        field="plan.micro_batch_size", value=plan.micro_batch_size)
    inp = _pipeline_inputs(ctx, ch)
    if not math.isfinite(inp.bound_s):
        raise SpecError(f"no placement of {model.name} with {plan.short()} fits cluster "
                        f"{cluster.name!r}: at best the stages hold {inp.fit_share:.0%} of its "
                        f"{model.num_layers} layers in GPU memory", field="plan",
                        value=plan.short())
    stage_types, layers, rec = _pipeline_ilp(inp, time_limit_s, ch.short())
    if stage_types is None or layers is None:
        raise SpecError(f"the pipeline ILP for {plan.short()} on {cluster.name!r} ended with "
                        f"status {rec.status}", field="plan", value=plan.short())
    return _pipeline_solution(ctx, inp, stage_types, layers, rec)


# ---- data-heterogeneous ILP ---------------------------------------------------------------------


def _replica_plan(ctx: _Ctx, ch: _Choice, dp: int) -> ParallelPlan:
    layers = None if ctx.model.num_layers % ch.pp == 0 else even_split(ctx.model.num_layers,
                                                                       ch.pp)
    return ch.plan(ctx.constants, dp=dp, layers_per_stage=layers)


def _simulate_group(ctx: _Ctx, ch: _Choice, gpu: str, replicas: int,
                    microbatches: int) -> tuple[StepReport, ParallelPlan, ClusterSpec]:
    """``simulate`` of ``replicas`` pipelines on the first GPUs of type ``gpu``, each running
    ``microbatches`` micro-batches (ZeRO shards over these replicas)."""
    width = ch.tp * ch.pp * ch.cp
    sub = _assemble(ctx.cluster, _take(ctx.cluster, gpu, 0, replicas * width), gpu)
    train = ctx.training.model_copy(
        update={"global_batch_size": replicas * microbatches * ch.mbs})
    plan = _replica_plan(ctx, ch, replicas)
    return simulate(ctx.model, sub, train, plan), plan, sub


def _union_dp_time(ctx: _Ctx, group: DataGroup, cluster: ClusterSpec,
                   union: tuple[int, ...]) -> float:
    """Exposed data-parallel synchronisation when the gradients of all types are all-reduced
    together and ``group`` finishes its backward last (seconds): ``simulate``'s own rule
    (``bucketed_grad_sync``: DDP buckets of 40M elements over the data-parallel ranks of stage
    0, overlapped with the first stage's backward of one micro-batch, NCCL slowing the
    overlapped compute) applied to ``union``, the stage-0 data-parallel ranks of all types
    on ``cluster``. With one type it is exactly what ``simulate`` charges."""
    rep, plan = group.report, group.plan
    if len(union) < 2:
        return 0.0
    layers = rep.extra["layers_per_stage"]
    times = [f + b for f, b in zip(rep.extra["stage_forward_s"], rep.extra["stage_backward_s"],
                                   strict=True)]
    crit = max(range(len(times)), key=lambda r: times[r])
    dense, experts = params_per_stage(ctx.model, plan, layers, crit)
    buckets = max(1.0, (dense + experts) / DDP_BUCKET_ELEMENTS)
    sync = bucketed_grad_sync(cluster.topology, union, ctx.model, plan, ctx.training,
                              dense + experts)
    dev = Device.of(ctx.types[group.gpu].gpu, ctx.training.precision, ctx.training.kernels)
    if plan.overlap_grad_reduce:
        window = float(rep.extra["stage_backward_s"][0])
        exposed = max(sync - window, sync / buckets) + min(sync, window) * dev.nccl_slowdown
    else:
        exposed = sync
    return exposed / plan.dp_sync_interval


def _compose(ctx: _Ctx, ch: _Choice, groups: list[DataGroup], cluster: ClusterSpec,
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
    htf = hardware_flops_per_step(ctx.model, tr.global_batch_size, tr.seq_len,
                                  ch.recompute) / step / n
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
    }
    report = StepReport(
        feasible=True, reasons=[], step_time_s=step, tokens_per_s=tr.tokens_per_step / step,
        model_tflops_per_gpu=mtf / 1e12, hardware_tflops_per_gpu=htf / 1e12,
        mfu=mtf / peak, hfu=htf / peak, memory_gb=dict(worst.report.memory_gb),
        memory_per_stage_gb=list(worst.report.memory_per_stage_gb), time_s=times,
        plan=plan.model_dump(), extra=extra)
    return report, plan


def _data_inputs(ctx: _Ctx, ch: _Choice,
                 fix: dict[str, Any]) -> tuple[dict[str, tuple[float, float]], float]:
    """Per GPU type the affine replica step (alpha_g, beta_g) seconds, and a lower bound on
    the step of any data-heterogeneous plan of ``ch`` (inf: nothing fits).

    ``simulate`` of all R_g replicas of type g at n = p and 2p micro-batches each gives
    alpha_g n + beta_g (1F1B: fill/drain, transfers, the type's gradient reduction and the
    optimizer in beta); a type whose R_g replicas do not fit in memory at n = p (the most
    micro-batches in flight) is left out. The bound is :func:`_replica_bound` over the
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
    bound = _replica_bound(_replica_times(ctx, ch, list(line)),
                           ctx.training.global_batch_size // ch.mbs, dp)
    return line, bound


def _solve_data(ctx: _Ctx, ch: _Choice, fix: dict[str, Any],
                line: dict[str, tuple[float, float]], time_limit_s: float,
                ) -> tuple[IlpCandidate | None, SolveRecord]:
    """The data-heterogeneous ILP of one choice, verified type by type with ``simulate``.

    ``line`` from :func:`_data_inputs`. Each type takes part with all its replicas or not
    at all (whole nodes keep the gradient all-reduce's rings regular, and ZeRO shards as
    simulated). ILP: integer micro-batches n_j per replica and a binary a_g per type,
    sum_j n_j = M (micro-batches of the global batch), a_g <= n_j <= M a_g,
    T >= alpha_g n_j + beta_g a_g, minimise T (milliseconds).

    Verification: per type, ``simulate`` of its active replicas at their largest n; the
    gradient reduction is then re-priced over the data-parallel ranks of all types
    (:func:`_union_dp_time`).
    """
    width = ch.tp * ch.pp * ch.cp
    M = ctx.training.global_batch_size // ch.mbs
    dp = int(fix["dp"]) if fix.get("dp") is not None else None
    count = {g: ctx.types[g].num_gpus // width for g in line}
    reps = [(g, j) for g in line for j in range(count[g])]
    prob = pulp.LpProblem("data_hetero", pulp.LpMinimize)
    nv = [_var(prob, f"n_{i}", 0, M, "Integer") for i in range(len(reps))]
    av = {g: _var(prob, f"a_{ctx.types[g].order}", cat="Binary") for g in line}
    big_t = _var(prob, "T", 0)
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
    rec = _cbc(prob, time_limit_s, "data", ch.short())
    if rec.objective is None:
        return None, rec
    shares: dict[str, list[int]] = {}
    for i, (g, _) in enumerate(reps):
        n = int(round(nv[i].varValue or 0.0))
        if n > 0:
            shares.setdefault(g, []).append(n)
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
    combined = _assemble(ctx.cluster, node_groups, "data")
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


# ---- baseline ----------------------------------------------------------------------------------


def _baseline(ctx: _Ctx, fix: dict[str, Any]) -> tuple[float | None, ParallelPlan | None]:
    """Best even-split plan on the original rank order (``simulate``; every stage paced by
    its slowest GPU and capped by its smallest memory), pruned by its exact compute
    bottleneck m * max_r t_r, seconds."""
    model, training, cluster = ctx.model, ctx.training, ctx.cluster
    n, L, B = cluster.num_gpus, model.num_layers, training.global_batch_size
    groups = cluster.topology.group_of_gpu
    first = cluster.node_groups[0].gpu.name
    gpn = min(g.gpus_per_node for g in cluster.node_groups)
    extra = tuple((k, fix[k]) for k in ("ep", "etp") if fix.get(k) is not None)
    todo: list[tuple[float, ParallelPlan]] = []
    for tp in [t for t in _pick(fix, "tp", divisors(gpn)) if _tp_ok(model, t)]:
        for cp in _pick(fix, "cp", [1]):
            for pp in _pick(fix, "pp", [p for p in divisors(n) if p <= L]):
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
                for sp in _pick(fix, "sequence_parallel", [tp > 1]):
                    if sp and tp == 1:
                        continue
                    for mbs in _pick(fix, "micro_batch_size",
                                     [b for b in divisors(B) if b <= MAX_MICRO_BATCH]):
                        if B % (dp * mbs):
                            continue
                        m = B // (dp * mbs)
                        base = ParallelPlan(tp=tp, cp=cp, sequence_parallel=sp,
                                            micro_batch_size=mbs, **dict(extra),
                                            **ctx.constants)
                        for rc in _recomputes(ctx, fix, base):
                            for z in _zero_stages(fix, dp):
                                plan = ParallelPlan(
                                    tp=tp, pp=pp, dp=dp, cp=cp, sequence_parallel=sp,
                                    micro_batch_size=mbs, recompute=rc, zero_stage=z,
                                    layers_per_stage=None if L % pp == 0 else layers,
                                    **dict(extra), **ctx.constants)
                                bound = m * max(
                                    max(_stage_time(_layer_costs(ctx, plan, first, g),
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


# ---- the search ----------------------------------------------------------------------------------


def _describe(cluster: ClusterSpec) -> str:
    counts: dict[str, int] = {}
    for g in cluster.node_groups:
        counts[g.gpu.name] = counts.get(g.gpu.name, 0) + g.num_gpus
    return ", ".join(f"{v}x {k}" for k, v in counts.items())


def ilp_search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
               fix: dict[str, Any] | None = None, time_limit_s: float = 20.0, top: int = 5,
               progress: Callable[[int, int], None] | None = None) -> IlpResult:
    """Best plans for a (heterogeneous) cluster by pipeline- and data-heterogeneous ILPs.

    Outer loop over structural choices (tp, dp, pp, micro-batch size, recompute, ZeRO
    stage; 1F1B; sequence parallelism whenever tp > 1; ``fix`` pins any ParallelPlan field,
    e.g. ``{"tp": 2, "pp": 4}`` or ``{"mbs": 2, "rc": "full"}``), visited best-first by a
    lower bound on the simulated step time (seconds): first compute-only, then refined with
    the memory limits, integer layers and the 1F1B fill (:func:`_span_bound`). A choice is
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

    Returns:
        An :class:`IlpResult`.

    Raises:
        SpecError: bad ``fix`` values, an MoE model whose layers differ (leading dense
            layers), or no plan fits the cluster (the message says how close it came).
    """
    start = time.perf_counter()
    if top < 1:
        raise SpecError(f"top={top} must be >= 1", field="top", value=top)
    if model.is_moe and model.first_dense_layers:
        raise SpecError(f"{model.name} mixes {model.first_dense_layers} dense layers with MoE "
                        "layers; the ILP search needs uniform layers (use the dp/evolutionary "
                        "searchers)", field="model", value=model.name)
    fixed = _normalise_fix(fix)
    constants = {k: fixed[k] for k in CONSTANT_FIELDS if k in fixed}
    ctx = _context(model, cluster, training, constants)
    choices = _enumerate(ctx, fixed)
    if not choices:
        raise SpecError(f"no legal layout of {model.name} on {cluster.name!r} "
                        f"({_describe(cluster)}) matches fix={fixed}: tp must divide the heads, "
                        "the FFN width and the GPUs per node, dp*mbs the global batch",
                        field="fix", value=fixed)
    bounds = []
    for ch in choices:
        lb = _pipeline_bound(ctx, ch) if ch.formulation == "pipeline" else \
            _data_bound(ctx, ch, fixed)
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
                inp = _pipeline_inputs(ctx, ch)
                best_share = max(best_share, inp.fit_share)
                heapq.heappush(heap, (max(lb, inp.bound_s), 1, i, inp))
            else:
                line, bound = _data_inputs(ctx, ch, fixed)
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
                cache[key] = _pipeline_ilp(inp, left, ch.short(), incumbent)
                solves.append(cache[key][2])
            stage_types, layers, rec = cache[key]
            if stage_types is not None and layers is not None:
                sol = _pipeline_solution(ctx, inp, stage_types, layers, rec)
                if not check_plan(model, sol.cluster, training, sol.plan):
                    # The ILP prices 1F1B; the same split under ZB-H1 (same in-flight memory,
                    # the weight-gradient pass fills the cool-down bubble) is re-timed by
                    # simulate and kept when it is faster.
                    best_rep, best_plan = None, sol.plan
                    for plan in (sol.plan, sol.plan.model_copy(update={"schedule": "zb-h1"})):
                        if plan.schedule != "1f1b" and (plan.pp == 1 or "schedule" in fixed):
                            continue
                        rep = simulate(model, sol.cluster, training, plan)
                        if rep.feasible and (best_rep is None
                                             or rep.step_time_s < best_rep.step_time_s):
                            best_rep, best_plan = rep, plan
                    if best_rep is not None:
                        best_rep.extra.update(formulation="pipeline", idle_gpus=sol.idle_gpus,
                                              ilp_stage_times_s=sol.stage_times_s)
                        cands.append(IlpCandidate(
                            "pipeline", best_rep, best_plan, sol.cluster, sol.stage_gpu_types,
                            sol.stage_times_s, sol.objective_s, sol.idle_gpus, rec))
        else:
            cand, drec = _solve_data(ctx, ch, fixed, data, left)
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
    base_step, base_plan = _baseline(ctx, fixed)
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
                      progress: Callable[[int, int], None] | None = None) -> Any:
    """:func:`ilp_search` as the common :class:`~paraplan.search.exhaustive.SearchResult`
    (``paraplan best --searcher ilp``). ``baseline_step_time_s`` is the best plan that treats
    every GPU as the slowest type in rank order; the ILP's formulation, solver status,
    optimality gap and solve counts go to ``extra``."""
    from paraplan.search.exhaustive import SearchResult

    res = ilp_search(model, cluster, training, fix=fix, time_limit_s=time_limit_s, top=top,
                     progress=progress)
    notes = [f"ILP ({res.formulation} formulation, CBC): {res.plans_evaluated} solves over "
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
