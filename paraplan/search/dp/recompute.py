"""(2) Per-layer recomputation as a knapsack under a memory budget (Galvatron-style): which layers
recompute what."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from paraplan.search.dp.algorithms import min_cost_cover
from paraplan.search.dp.costs import GpuCosts, gpu_costs, make_context, stage_time
from paraplan.simulator.memory import (
    ALLOCATOR_FRAGMENTATION,
    GiB,
    layer_activations,
    pipeline_memory,
)
from paraplan.simulator.step import even_split
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

MiB = 2**20
RECOMPUTE_UNIT_BYTES = 64 * MiB
"""Memory quantum of the recompute knapsack (bytes)."""


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
    less what an early-stopping checkpoint leaves out, as ``simulate`` charges
    ``recompute=full``). Recomputing any layer of a stage also
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
    ctx = make_context(model, cluster, training, plan)
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
    costs: dict[tuple[str, int], tuple[GpuCosts, GpuCosts]] = {}
    for r, gpus in enumerate(ctx.stage_gpus):
        for name, gpu in gpus.items():
            key = ctx.key(r, name)
            if key not in costs:
                costs[key] = (gpu_costs(model, cluster, training, none_plan, gpu, key[1]),
                              gpu_costs(model, cluster, training, full_plan, gpu, key[1]))

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
        is_moe = [model.is_moe_layer(i) for i in ids]
        n_moe = sum(is_moe)
        save = [keep * ((la_none.moe - la_full.moe) if mo else (la_none.dense - la_full.dense))
                * ctx.inflight[r] for mo in is_moe]
        base = {name: float(stage_time(costs[ctx.key(r, name)][0], layers[r] - n_moe, n_moe,
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
