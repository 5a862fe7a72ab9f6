"""Dynamic-programming searchers: pipeline layer partition and per-layer recomputation.

Two exact (or conservatively discretised) DPs over the simulator's own cost model:

* :func:`optimal_layer_split` - the contiguous split of the transformer layers over the
  pipeline stages that minimises the bottleneck stage time (forward + backward of one
  micro-batch) under a per-stage memory cap. This is the classic linear-partition DP
  (PipeDream, Narayanan et al. 2019 sec 3.1; the balanced-stage objective of Narayanan et al.
  2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM";
  Alpa, Zheng et al. 2022 sec 5.2, and Galvatron, Miao et al. 2022 use the same min-max
  recurrence): ``best[r][j] = min_i max(best[r-1][i], cost_r(i, j))``, O(pp * L^2).
* :func:`per_layer_recompute` - per-layer activation checkpointing (full recompute vs none)
  under a memory budget as a 0/1 knapsack over layers with memory discretised into units
  (64 MiB by default), in the spirit of Galvatron (Miao et al. 2022, "Galvatron: Efficient
  Transformer Training over Multiple GPUs Using Automatic Parallelism", sec 4, which runs a
  knapsack DP over layers with discretised memory) and Checkmate (Jain et al. 2020).

Costs come from the simulator (``simulator.compute.layer_times`` / ``step.head_times``, exposed
TP/CP/EP communication as ``simulator.step.simulate`` charges it, ``memory.pipeline_memory``
with the schedule's in-flight micro-batches), so ``simulate`` of the returned plan reports the
same stage times and memory. Times are seconds, memory is bytes internally and GiB (2^30
bytes) in results. All functions are pure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from paraplan.search.exhaustive import Progress, SearchResult
from paraplan.search.space import SpaceOptions
from paraplan.simulator.compute import Device
from paraplan.simulator.memory import (
    ALLOCATOR_FRAGMENTATION,
    GiB,
    LayerActivations,
    layer_activations,
    pipeline_memory,
)
from paraplan.simulator.pipeline import inflight_microbatches
from paraplan.simulator.step import (
    StepReport,
    even_split,
    head_times,
    layer_cost,
    stage_gpu_types,
)
from paraplan.specs.checks import validate_plan
from paraplan.specs.cluster import ClusterSpec, GPUSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

MiB = 2**20
RECOMPUTE_UNIT_BYTES = 64 * MiB
"""Memory quantum of the recompute knapsack (bytes)."""


# ---- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerSplit:
    """The bottleneck-optimal contiguous layer split (see :func:`optimal_layer_split`)."""

    layers_per_stage: list[int]
    """Transformer layers per pipeline stage, first stage first (each >= 1)."""
    bottleneck_s: float
    """Slowest stage's forward + backward time of one micro-batch, seconds."""
    stage_times_s: list[float]
    """Every stage's forward + backward time of one micro-batch, seconds (incl. LM head on
    the last stage and exposed TP/CP/EP communication)."""
    stage_memory_gb: list[float]
    """Peak memory of one rank of every stage, GiB (2^30 bytes)."""
    plan: ParallelPlan
    """The input plan with ``layers_per_stage`` set."""
    stage_memory_capacity_gb: list[float]
    """Each stage's memory cap (its smallest GPU), GiB."""


@dataclass(frozen=True)
class RecomputeChoice:
    """Per-layer full-recompute decisions (see :func:`per_layer_recompute`).

    An analytical result: ``ParallelPlan.recompute`` is one global mode, so ``simulate``
    cannot run a mixed choice. Megatron-LM expresses it per stage as
    ``--recompute-granularity full --recompute-method block --recompute-num-layers k``.
    """

    layers_per_stage: list[int]
    """Transformer layers per stage (the plan's split, or the even split)."""
    recompute_layers_per_stage: list[int]
    """How many layers of each stage are fully recomputed."""
    recompute_layers: list[list[int]]
    """Global indices of the recomputed layers, per stage."""
    stage_times_s: list[float]
    """Forward + backward (+ recomputation) time of one micro-batch per stage, seconds."""
    bottleneck_s: float
    """Slowest stage's time, seconds."""
    stage_memory_gb: list[float]
    """Peak memory of one rank of every stage with this choice, GiB (2^30 bytes)."""
    memory_budget_gb: list[float]
    """The budget each stage was held to, GiB."""
    unit_bytes: int
    """Memory quantum of the knapsack, bytes."""


# ---- generic DPs -----------------------------------------------------------------------------


def min_bottleneck_partition(stage_cost: Sequence[np.ndarray]) -> tuple[list[int], float]:
    """Exact min-max contiguous partition of L items over ``len(stage_cost)`` stages.

    The linear-partition DP (PipeDream, Narayanan et al. 2019 sec 3.1): with
    ``best[r][j]`` the smallest bottleneck placing items [0, j) on stages 0..r,
    ``best[r][j] = min_{i<j} max(best[r-1][i], stage_cost[r][i, j])``. O(p * L^2) work,
    vectorised over i.

    Args:
        stage_cost: one (L+1) x (L+1) array per stage; ``stage_cost[r][i, j]`` is the cost of
            stage r holding items [i, j) (any unit; ``inf`` forbids it, e.g. out of memory).
            Only entries with i < j are read, so every stage gets >= 1 item.

    Returns:
        (items per stage, bottleneck). The bottleneck is ``inf`` when every split is
        forbidden; the counts are then those of an arbitrary split.

    Raises:
        ValueError: no stages, shapes disagree, or more stages than items.
    """
    p = len(stage_cost)
    if p == 0:
        raise ValueError("need at least one stage")
    size = stage_cost[0].shape[0]
    if any(c.shape != (size, size) for c in stage_cost):
        raise ValueError("every stage_cost must be the same (L+1) x (L+1) shape")
    n = size - 1
    if p > n:
        raise ValueError(f"{p} stages cannot each get >= 1 of {n} items")
    upper = np.triu(np.ones((size, size), dtype=bool), k=1)  # i < j
    best = np.where(upper[0], stage_cost[0][0], np.inf)
    choice: list[np.ndarray] = []
    for r in range(1, p):
        cand = np.maximum(best[:, None], np.where(upper, stage_cost[r], np.inf))
        arg = np.argmin(cand, axis=0)
        best = cand[arg, np.arange(size)]
        choice.append(arg)
    bottleneck = float(best[n])
    cuts = [n]
    j = n
    for r in range(p - 1, 0, -1):
        j = int(choice[r - 1][j])
        cuts.append(j)
    cuts.append(0)
    cuts.reverse()
    counts = [cuts[k + 1] - cuts[k] for k in range(p)]
    if not math.isfinite(bottleneck):
        counts = even_split(n, p)
    return counts, bottleneck


def min_cost_cover(costs: Sequence[float], savings: Sequence[int],
                   need: int) -> tuple[list[int], float] | None:
    """0/1 knapsack, covering form: the cheapest subset of items whose savings sum to >= need.

    ``dp[x]`` = least cost reaching min(need, saved) = x units after each item, O(n * need).
    Ties keep the smaller subset (an item is taken only when strictly cheaper).

    Args:
        costs: cost of each item (>= 0, e.g. seconds of extra forward).
        savings: what each item saves, in whole units (>= 0, e.g. 64 MiB quanta).
        need: units that must be saved.

    Returns:
        (chosen item indices ascending, total cost), or None when even all items fall short.
    """
    if len(costs) != len(savings):
        raise ValueError("costs and savings differ in length")
    if any(c < 0 for c in costs) or any(s < 0 for s in savings):
        raise ValueError("costs and savings must be >= 0")
    if need <= 0:
        return [], 0.0
    if sum(savings) < need:
        return None
    states = np.arange(need + 1)
    dp = np.full(need + 1, np.inf)
    dp[0] = 0.0
    taken: list[np.ndarray] = []
    pred_full: list[int] = []
    for cost, save in zip(costs, savings, strict=True):
        cand = np.full(need + 1, np.inf)
        if save > 0:
            # States below need come from exactly x - save; the capped state from any
            # x' >= need - save.
            low = states[save:need]
            cand[save:need] = dp[low - save] + cost
            lo = max(0, need - save)
            k = int(np.argmin(dp[lo:])) + lo
            cand[need] = dp[k] + cost
            pred_full.append(k)
        else:
            pred_full.append(need)
        take = cand < dp
        dp = np.where(take, cand, dp)
        taken.append(take)
    if not math.isfinite(dp[need]):
        return None
    chosen: list[int] = []
    x = need
    for idx in range(len(costs) - 1, -1, -1):
        if taken[idx][x]:
            chosen.append(idx)
            x = pred_full[idx] if x == need else x - savings[idx]
    chosen.reverse()
    return chosen, float(sum(costs[i] for i in chosen))


# ---- the simulator's per-layer costs ---------------------------------------------------------


@dataclass(frozen=True)
class _GpuCosts:
    """One GPU type: seconds per layer (forward, backward) and of the LM head, 1 micro-batch."""

    dense_f: float
    dense_b: float
    moe_f: float
    moe_b: float
    head_f: float
    head_b: float


@dataclass(frozen=True)
class _Context:
    p: int
    dp: int
    m: int
    inflight: list[float]
    stage_gpus: list[dict[str, GPUSpec]]
    caps_gib: list[float]
    stage_base: list[dict[str, int]]
    """Per stage and GPU type: the rank whose TP/CP/EP groups price its layers (step.py)."""

    def key(self, r: int, name: str) -> tuple[str, int]:
        return name, self.stage_base[r][name]


def _context(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
             plan: ParallelPlan) -> _Context:
    """Pipeline shape, in-flight micro-batches and each stage's GPU types (as step.py)."""
    if plan.virtual_stages != 1:
        raise ValueError(f"virtual_stages={plan.virtual_stages}: the DP splits whole stages; "
                         "use virtual_stages=1")
    p = plan.pp
    if p > model.num_layers:
        raise SpecError(f"pp={p} exceeds num_layers={model.num_layers}; every stage needs a "
                        "layer", field="plan.pp", value=p)
    validate_plan(model, cluster, training,
                  plan.model_copy(update={"layers_per_stage": even_split(model.num_layers, p)}))
    dp = plan.resolved_dp(cluster.num_gpus)
    m = training.global_batch_size // (dp * plan.micro_batch_size)
    inflight = [inflight_microbatches(plan.schedule, p, m, r, v=1) for r in range(p)]
    span = dp * plan.tp * plan.cp
    stage_gpus, stage_base = stage_gpu_types(cluster, plan, p, span)
    caps = [min(g.memory_GiB for g in gpus.values()) for gpus in stage_gpus]
    return _Context(p, dp, m, inflight, stage_gpus, caps, stage_base)


def _layer_pass(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                plan: ParallelPlan, device: Device, *, moe: bool,
                base_rank: int = 0) -> tuple[float, float]:
    """(forward, backward) seconds of one layer, one micro-batch, incl. exposed TP/CP/EP
    communication and recomputation: ``simulator.step.layer_cost``."""
    cost = layer_cost(model, cluster.topology, training, plan, device, moe=moe,
                      base_rank=base_rank)
    return cost.fwd, cost.bwd


def _gpu_costs(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
               plan: ParallelPlan, gpu: GPUSpec, base_rank: int = 0) -> _GpuCosts:
    dev = Device.of(gpu, training.precision, training.kernels)
    dense = _layer_pass(model, cluster, training, plan, dev, moe=False, base_rank=base_rank)
    moe = (_layer_pass(model, cluster, training, plan, dev, moe=True, base_rank=base_rank)
           if model.is_moe else dense)
    head = head_times(model, cluster.topology, training, plan, dev, base_rank=base_rank)
    return _GpuCosts(dense[0], dense[1], moe[0], moe[1], head.fwd, head.bwd)


def _dense_before(model: ModelSpec, idx: np.ndarray) -> np.ndarray:
    """Dense (non-MoE) layers among global layers [0, idx) (dense ones lead the model)."""
    if not model.is_moe:
        return idx
    return np.minimum(idx, model.first_dense_layers)


def _stage_time(c: _GpuCosts, n_dense: np.ndarray | int, n_moe: np.ndarray | int,
                last: bool) -> np.ndarray | float:
    """Forward + backward seconds of a stage on one GPU type (step.py's arithmetic)."""
    f = n_dense * c.dense_f + n_moe * c.moe_f
    b = n_dense * c.dense_b + n_moe * c.moe_b
    if last:
        f, b = f + c.head_f, b + c.head_b
    return f + b


def _stage_memory_bytes(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, dp: int,
                        p: int, stage: int, start: int, count: int, inflight: float,
                        la: LayerActivations) -> float:
    """Peak bytes of one rank of ``stage`` holding layers [start, start+count)."""
    layers = [0] * p
    if stage > 0:
        layers[stage - 1] = start
    layers[stage] = count
    mem = pipeline_memory(model, training, plan, dp=dp, layers=layers,
                          inflight=[inflight] * p, per_layer=la, only=stage)
    return mem[0].peak


def _time_with(base: dict[str, float], extras: dict[str, list[float]],
               chosen: Sequence[int]) -> float:
    """Stage seconds with ``chosen`` layers recomputed: its slowest GPU type's time."""
    return max(base[name] + sum(extras[name][k] for k in chosen) for name in base)


def _mem_with(mem_none: float, save: Sequence[float], working: float,
              chosen: Sequence[int]) -> float:
    """Stage peak bytes with ``chosen`` layers recomputed."""
    if not chosen:
        return mem_none
    return mem_none - sum(save[k] for k in chosen) + working


def _solve_stage(base: dict[str, float], extras: dict[str, list[float]], save: list[float],
                 mem_none: float, working: float, budget: float,
                 unit_bytes: int) -> list[int] | None:
    """Cheapest set of a stage's layers to recompute so it fits ``budget`` bytes (or None)."""
    if mem_none <= budget:
        return []
    need_units = math.ceil((mem_none + working - budget) / unit_bytes)
    units = [int(s // unit_bytes) for s in save]
    best: tuple[float, list[int]] | None = None
    for name in base:
        res = min_cost_cover(extras[name], units, need_units)
        if res is not None:
            t = _time_with(base, extras, res[0])
            if best is None or t < best[0]:
                best = (t, res[0])
    if best is not None:
        return best[1]
    every = list(range(len(save)))
    if _mem_with(mem_none, save, working, every) <= budget:
        return every  # fits exactly; only the conservative rounding said no
    return None


# ---- (1) optimal layer split -----------------------------------------------------------------


def optimal_layer_split(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                        plan: ParallelPlan) -> LayerSplit:
    """Exact bottleneck-optimal contiguous split of the layers over ``plan.pp`` stages.

    Minimises max over stages of the forward + backward time (seconds) of one micro-batch
    on the stage - its layers, the LM head on the last stage, exposed TP/CP/EP communication
    and recomputation as ``simulate`` charges them; the word embedding is a lookup the
    simulator gives no time, only memory on the first stage - subject to every stage's peak
    memory (``pipeline_memory`` with the schedule's in-flight micro-batches, bytes) fitting
    in its smallest GPU's ``memory_GiB`` (GiB = 2^30 bytes). Every stage gets >= 1 layer.
    MoE models' leading ``first_dense_layers`` cost differently from the MoE layers after
    them; on a mixed cluster stage r (ranks [r*dp*tp*cp, (r+1)*dp*tp*cp)) is paced by its
    slowest GPU type and capped by its smallest memory, so costs are per stage.

    Exact linear-partition DP over (stage, first layer, end layer), O(pp * L^2) (PipeDream,
    Narayanan et al. 2019; Megatron-LM, Narayanan et al. 2021; Galvatron, Miao et al. 2022).
    Minimising the bottleneck minimises the steady-state 1F1B/GPipe step time (m x the
    slowest stage); fill and drain add the sum of the stages, which no split changes on a
    homogeneous cluster. Among splits with the same bottleneck, the one with the lowest
    worst-stage memory (beyond its cap) is returned (a second min-max DP).

    Args:
        model, cluster, training: the specs.
        plan: the plan (its ``layers_per_stage`` is ignored); ``virtual_stages`` must be 1.

    Returns:
        A :class:`LayerSplit`; ``split.plan`` has ``layers_per_stage`` set.

    Raises:
        ValueError: ``plan.virtual_stages != 1``.
        SpecError: an illegal plan, or no split fits in memory (names the stage and the GiB
            missing in the split that comes closest).
    """
    ctx = _context(model, cluster, training, plan)
    p, n = ctx.p, model.num_layers
    la = layer_activations(model, training, plan)
    per_gpu: dict[tuple[str, int], _GpuCosts] = {}
    for r, gpus in enumerate(ctx.stage_gpus):
        for name, gpu in gpus.items():
            key = ctx.key(r, name)
            if key not in per_gpu:
                per_gpu[key] = _gpu_costs(model, cluster, training, plan, gpu, key[1])

    idx = np.arange(n + 1)
    dense_before = _dense_before(model, idx)
    n_dense = dense_before[None, :] - dense_before[:, None]  # [i, j] -> dense in [i, j)
    n_total = idx[None, :] - idx[:, None]
    n_moe = n_total - n_dense
    upper = n_total > 0

    times: list[np.ndarray] = []
    mems: list[np.ndarray] = []  # peak bytes of one rank
    over: list[np.ndarray] = []  # memory beyond the cap, bytes
    mem_cache: dict[tuple[int, int, bool, bool, float], float] = {}
    for r in range(p):
        last = r == p - 1
        t = np.zeros((n + 1, n + 1))
        for name in ctx.stage_gpus[r]:
            t = np.maximum(t, _stage_time(per_gpu[ctx.key(r, name)], n_dense, n_moe, last))
        times.append(t)
        mem = np.full((n + 1, n + 1), np.inf)
        starts = [0] if r == 0 else range(r, n)
        for i in starts:
            # Stage r needs r layers before it and p - r - 1 after it.
            end_max = n if last else n - (p - r - 1)
            end_min = n if last else i + 1
            for j in range(end_min, end_max + 1):
                key = (j - i, int(n_moe[i, j]), r == 0, last, ctx.inflight[r])
                if key not in mem_cache:
                    mem_cache[key] = _stage_memory_bytes(model, training, plan, ctx.dp, p, r, i,
                                                         j - i, ctx.inflight[r], la)
                mem[i, j] = mem_cache[key]
        mems.append(mem)
        over.append(np.where(upper, mem - ctx.caps_gib[r] * GiB, np.inf))

    allowed = [np.where(o <= 0, t, np.inf) for o, t in zip(over, times, strict=True)]
    counts, bottleneck = min_bottleneck_partition(allowed)
    if not math.isfinite(bottleneck):
        closest, short = min_bottleneck_partition(over)
        starts_c = np.concatenate([[0], np.cumsum(closest)])
        worst = max(range(p), key=lambda s: over[s][starts_c[s], starts_c[s + 1]])
        need = mems[worst][starts_c[worst], starts_c[worst + 1]] / GiB
        raise SpecError(
            f"no split of {n} layers over pp={p} stages fits in memory: at best (layers "
            f"{'/'.join(map(str, closest))}) stage {worst} needs {need:.1f} GiB of its "
            f"{ctx.caps_gib[worst]:g} GiB, {short / GiB:.1f} GiB short; try recompute="
            "selective/full, a higher zero_stage, a smaller micro_batch_size or more tp/pp",
            field="plan.layers_per_stage", value=plan.short(),
            allowed=f"splits whose every stage fits in {min(ctx.caps_gib):g} GiB")

    # Ties: among the bottleneck-optimal splits, the one whose fullest stage (memory beyond
    # its cap) is emptiest - a second min-max DP with the time bound as the mask.
    tied = [np.where(a <= bottleneck, o, np.inf) for a, o in zip(allowed, over, strict=True)]
    counts, _ = min_bottleneck_partition(tied)
    starts_f = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    stage_times = [float(times[r][starts_f[r], starts_f[r + 1]]) for r in range(p)]
    stage_mem = [float(mems[r][starts_f[r], starts_f[r + 1]] / GiB) for r in range(p)]
    return LayerSplit(
        layers_per_stage=counts,
        bottleneck_s=max(stage_times),
        stage_times_s=stage_times,
        stage_memory_gb=stage_mem,
        plan=plan.model_copy(update={"layers_per_stage": counts}),
        stage_memory_capacity_gb=list(ctx.caps_gib),
    )


# ---- (2) per-layer recomputation -------------------------------------------------------------


def per_layer_recompute(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                        plan: ParallelPlan,
                        memory_budget_gb: float | Sequence[float] | None = None, *,
                        unit_bytes: int = RECOMPUTE_UNIT_BYTES) -> RecomputeChoice:
    """Choose, per layer, full recomputation or none, to minimise each stage's time in budget.

    Galvatron-style (Miao et al. 2022, sec 4) 0/1 knapsack over the layers of each stage:
    recomputing a layer saves ``(activation bytes without recompute - with full recompute)
    x in-flight micro-batches`` (Korthikanti et al. 2022's per-layer terms via
    ``memory.layer_activation_bytes``, plus the allocator's fragmentation share the simulator
    adds) and costs one extra forward of the layer (incl. its exposed TP/CP/EP communication,
    as ``simulate`` charges ``recompute=full``). Recomputing any layer of a stage also
    re-materialises one layer's full activations during its backward (the simulator's
    ``LayerActivations.working``), charged once per stage.

    Memory is discretised into ``unit_bytes`` quanta (default 64 MiB = 2^26 bytes), rounded
    conservatively - each layer's saving down, the memory to free up - so the chosen set never
    exceeds the budget; the answer can be at most one quantum per layer more cautious than the
    exact optimum. Each stage is solved on its own (minimising every stage's time also
    minimises the bottleneck). On a stage spanning several GPU types the knapsack runs with
    each type's costs and the choice that minimises the slowest type's time wins (exact on
    single-type stages).

    This is an analytical result: the simulator's ``ParallelPlan.recompute`` is a single
    global mode, so the mixed choice cannot be passed to ``simulate``; with nothing or
    everything recomputed it reproduces ``simulate``'s ``recompute="none"`` / ``"full"``
    stage times and memory. ``plan.recompute`` is ignored.

    Args:
        model, cluster, training: the specs.
        plan: the plan; its ``layers_per_stage`` (or the even split) is kept.
        memory_budget_gb: per-rank budget in GiB (2^30 bytes): one number for every stage,
            one per stage, or None = each stage's GPU memory (its smallest GPU on a mixed
            cluster).
        unit_bytes: the knapsack's memory quantum, bytes.

    Returns:
        A :class:`RecomputeChoice`.

    Raises:
        ValueError: ``plan.virtual_stages != 1``, ``unit_bytes < 1`` or a budget list whose
            length is not ``plan.pp``.
        SpecError: an illegal plan, or a stage that does not fit even with every layer
            recomputed (names the stage and the GiB missing).
    """
    if unit_bytes < 1:
        raise ValueError(f"unit_bytes={unit_bytes} must be >= 1")
    ctx = _context(model, cluster, training, plan)
    p, n = ctx.p, model.num_layers
    layers = list(plan.layers_per_stage or even_split(n, p))
    if len(layers) != p or sum(layers) != n or min(layers) < 1:
        raise SpecError(f"layers_per_stage={layers} must give each of the {p} stages >= 1 "
                        f"layer and add up to {n}", field="plan.layers_per_stage",
                        value=layers)
    if memory_budget_gb is None:
        budgets_gb = list(ctx.caps_gib)
    elif isinstance(memory_budget_gb, int | float):
        budgets_gb = [float(memory_budget_gb)] * p
    else:
        budgets_gb = [float(b) for b in memory_budget_gb]
        if len(budgets_gb) != p:
            raise ValueError(f"memory_budget_gb has {len(budgets_gb)} entries; pp={p} needs "
                             f"one per stage")
    none_plan = plan.model_copy(update={"recompute": "none", "layers_per_stage": layers})
    full_plan = plan.model_copy(update={"recompute": "full", "layers_per_stage": layers})
    la_none = layer_activations(model, training, none_plan)
    la_full = layer_activations(model, training, full_plan)
    mem_none = [mm.peak for mm in pipeline_memory(model, training, none_plan, dp=ctx.dp,
                                                  layers=layers, inflight=ctx.inflight,
                                                  per_layer=la_none)]
    keep = 1.0 + ALLOCATOR_FRAGMENTATION
    working = keep * la_full.working

    # Per GPU type: (base, extra-per-dense-layer, extra-per-MoE-layer) seconds.
    costs: dict[tuple[str, int], tuple[_GpuCosts, _GpuCosts]] = {}
    for r, gpus in enumerate(ctx.stage_gpus):
        for name, gpu in gpus.items():
            key = ctx.key(r, name)
            if key not in costs:
                costs[key] = (_gpu_costs(model, cluster, training, none_plan, gpu, key[1]),
                              _gpu_costs(model, cluster, training, full_plan, gpu, key[1]))

    def extra(key: tuple[str, int], moe: bool) -> float:
        c0, c1 = costs[key]
        if moe:
            return (c1.moe_f + c1.moe_b) - (c0.moe_f + c0.moe_b)
        return (c1.dense_f + c1.dense_b) - (c0.dense_f + c0.dense_b)

    picks: list[list[int]] = []
    times: list[float] = []
    mems: list[float] = []
    budgets: list[float] = []
    start = 0
    for r in range(p):
        ids = list(range(start, start + layers[r]))
        is_moe = [model.is_moe and i >= model.first_dense_layers for i in ids]
        n_moe = sum(is_moe)
        save = [keep * ((la_none.moe - la_full.moe) if mo else (la_none.dense - la_full.dense))
                * ctx.inflight[r] for mo in is_moe]
        base = {name: float(_stage_time(costs[ctx.key(r, name)][0], layers[r] - n_moe, n_moe,
                                        r == p - 1))
                for name in ctx.stage_gpus[r]}
        extras = {name: [extra(ctx.key(r, name), mo) for mo in is_moe]
                  for name in ctx.stage_gpus[r]}
        budget_gb = budgets_gb[r]
        budget = budget_gb * GiB
        chosen = _solve_stage(base, extras, save, mem_none[r], working, budget, unit_bytes)
        if chosen is None:
            short = (mem_none[r] - sum(save) + working - budget) / GiB
            raise SpecError(
                f"stage {r} does not fit in {budget_gb:g} GiB even with all {len(ids)} of its "
                f"layers recomputed ({short:.1f} GiB short); try a higher zero_stage, a smaller "
                "micro_batch_size or more tp/pp", field="memory_budget_gb", value=budget_gb)
        picks.append([ids[k] for k in chosen])
        times.append(_time_with(base, extras, chosen))
        mems.append(_mem_with(mem_none[r], save, working, chosen) / GiB)
        budgets.append(budget_gb)
        start += layers[r]
    return RecomputeChoice(
        layers_per_stage=layers,
        recompute_layers_per_stage=[len(x) for x in picks],
        recompute_layers=picks,
        stage_times_s=times,
        bottleneck_s=max(times),
        stage_memory_gb=mems,
        memory_budget_gb=budgets,
        unit_bytes=unit_bytes,
    )



def dp_search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
              fix: dict[str, Any] | None = None, top: int = 10,
              options: SpaceOptions | None = None, progress: Progress | None = None,
              candidates: int = 48) -> SearchResult:
    """Exhaustive ranking, then the exact layer-split DP on the best pipelined plans.

    The vectorized evaluator ranks every plan (even or near-even splits, timed even when they
    do not fit); the ``candidates`` fastest non-interleaved pipelined plans whose even split
    needs at most 25% more memory than the GPU has are re-split by
    :func:`optimal_layer_split` (a rebalanced split can fit where the even one does not) and
    simulated. The result holds the best ``top`` of those and of the exhaustive top, by
    ``simulate()`` step time, so it is never slower than the exhaustive searcher's best.
    """
    import time

    from paraplan.search.exhaustive import oom_reasons, rank_key, top_k
    from paraplan.search.space import build_space, evaluate_space
    from paraplan.simulator.step import simulate

    start = time.perf_counter()
    space = build_space(model, cluster, training, fix, options)
    if len(space) == 0:
        raise SpecError(f"no legal plan for {model.name} on {cluster.num_gpus} GPUs",
                        field="plan", value=str(fix or {}))
    ev = evaluate_space(space, progress, exact_interleaved=False, times_for_oom=True)
    feasible = ev.feasible
    bound = space.cols["uneven"] == 0

    def sim(i: int) -> StepReport:
        return simulate(model, cluster, training, space.plan(i))

    reports = top_k(ev.step_time_s, bound, feasible, top, sim) if feasible.any() else []
    c = space.cols
    pipelined = (c["pp"] > 1) & (c["v"] == 1) & (ev.peak_gib <= 1.25 * ev.capacity_gib)
    rows = np.nonzero(pipelined & np.isfinite(ev.step_time_s))[0]
    rows = rows[np.argsort(ev.step_time_s[rows], kind="stable")][:candidates]
    seen = {json.dumps(r.plan, sort_keys=True) for r in reports}
    resplit = 0
    for i in rows.tolist():
        plan = space.plan(i)
        try:
            split = optimal_layer_split(model, cluster, training,
                                        plan.model_copy(update={"layers_per_stage": None}))
        except SpecError:
            continue
        resplit += 1
        rep = simulate(model, cluster, training, split.plan)
        key = json.dumps(rep.plan, sort_keys=True)
        if rep.feasible and key not in seen:
            seen.add(key)
            reports.append(rep)
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
