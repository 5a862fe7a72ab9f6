"""(1) The bottleneck-optimal contiguous layer-to-stage split under each stage's memory cap
(embedding and LM head on the end stages)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from paraplan.search.dp.algorithms import min_bottleneck_partition
from paraplan.search.dp.costs import (
    GpuCosts,
    dense_layers_before,
    gpu_costs,
    make_context,
    stage_memory_bytes,
    stage_time,
)
from paraplan.simulator.memory import GiB, layer_activations
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec


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
    ctx = make_context(model, cluster, training, plan)
    p, n = ctx.p, model.num_layers
    la = layer_activations(model, training, plan)
    per_gpu: dict[tuple[str, int], GpuCosts] = {}
    for r, gpus in enumerate(ctx.stage_gpus):
        for name, gpu in gpus.items():
            key = ctx.key(r, name)
            if key not in per_gpu:
                per_gpu[key] = gpu_costs(model, cluster, training, plan, gpu, key[1])

    idx = np.arange(n + 1)
    dense_before = dense_layers_before(model, idx)
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
            t = np.maximum(t, stage_time(per_gpu[ctx.key(r, name)], n_dense, n_moe, last))
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
                    mem_cache[key] = stage_memory_bytes(model, training, plan, ctx.dp, p, r, i,
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
