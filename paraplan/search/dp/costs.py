"""The simulator's per-layer costs for the DP searcher: forward/backward seconds per GPU type,
stage time and stage memory (bytes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.simulator.compute import Device
from paraplan.simulator.memory import LayerActivations, pipeline_memory
from paraplan.simulator.moe import a2a_overlap_warmup
from paraplan.simulator.pipeline import inflight_microbatches
from paraplan.simulator.step import even_split, head_times, layer_cost, stage_gpu_types
from paraplan.specs.checks import validate_plan
from paraplan.specs.cluster import ClusterSpec, GPUSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec


@dataclass(frozen=True)
class GpuCosts:
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


def make_context(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
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
    warm = a2a_overlap_warmup(model, training, plan)
    inflight = [inflight_microbatches(plan.schedule, p, m, r, v=1, extra=warm)
                for r in range(p)]
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


def gpu_costs(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
              plan: ParallelPlan, gpu: GPUSpec, base_rank: int = 0) -> GpuCosts:
    dev = Device.of_training(gpu, training, synced_gpus=plan.world_size(cluster.num_gpus))
    dense = _layer_pass(model, cluster, training, plan, dev, moe=False, base_rank=base_rank)
    moe = (_layer_pass(model, cluster, training, plan, dev, moe=True, base_rank=base_rank)
           if model.is_moe else dense)
    head = head_times(model, cluster.topology, training, plan, dev, base_rank=base_rank)
    return GpuCosts(dense[0], dense[1], moe[0], moe[1], head.fwd, head.bwd)


def dense_layers_before(model: ModelSpec, idx: np.ndarray) -> np.ndarray:
    """Dense (non-MoE) layers among global layers [0, idx) (``ModelSpec.is_moe_layer``)."""
    return idx - model.moe_layers_before(idx)


def stage_time(c: GpuCosts, n_dense: np.ndarray | int, n_moe: np.ndarray | int,
               last: bool) -> np.ndarray | float:
    """Forward + backward seconds of a stage on one GPU type (step.py's arithmetic)."""
    f = n_dense * c.dense_f + n_moe * c.moe_f
    b = n_dense * c.dense_b + n_moe * c.moe_b
    if last:
        f, b = f + c.head_f, b + c.head_b
    return f + b


def stage_memory_bytes(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, dp: int,
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
