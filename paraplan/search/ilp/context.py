"""Per-search context: GPU types, the simulator's per-layer costs and activations on each type."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from paraplan.simulator.compute import Device
from paraplan.simulator.memory import LayerActivations, layer_activations
from paraplan.simulator.step import head_times, layer_cost
from paraplan.specs.cluster import ClusterSpec, GPUSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec


@dataclass(frozen=True)
class _GpuType:
    name: str
    gpu: GPUSpec
    num_gpus: int
    gpn_gcd: int
    """gcd of gpus_per_node over this type's node groups (TP must divide it)."""
    order: int


@dataclass
class Ctx:
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
class Choice:
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
        if data.get("tp_comm_overlap") and not (data["tp"] > 1 and data["sequence_parallel"]):
            data["tp_comm_overlap"] = False  # nothing to overlap (and Megatron needs SP for it)
        return ParallelPlan(**data)

    def short(self) -> str:
        rep = "dp=replicas" if self.formulation == "data" else f"dp={self.dp}"
        sp = " sp" if self.sp else ""
        return (f"tp={self.tp} pp={self.pp} {rep}{' cp=' + str(self.cp) if self.cp > 1 else ''}"
                f"{sp} zero={self.zero} mbs={self.mbs} rc={self.recompute}")


def make_context(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
             constants: dict[str, Any]) -> Ctx:
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
    return Ctx(model, cluster, training, constants, types)


def rebuild(cluster: ClusterSpec, **update: Any) -> ClusterSpec:
    """A new ClusterSpec with fields replaced. Built through the constructor, not
    ``model_copy``: the copy would inherit the original's cached ``topology``."""
    data = {name: getattr(cluster, name) for name in ClusterSpec.model_fields}
    data.update(update)
    return ClusterSpec(**data)


def _probe(ctx: Ctx, first: str) -> ClusterSpec:
    """The cluster with GPU type ``first``'s node groups moved to the front.

    ``simulate`` prices TP/CP/EP collectives on the first group of ranks of the cluster it
    is given (ranks 0..tp-1), so on a reordered cluster they run over the links of the type
    that hosts stage 0; per-layer costs are computed on this probe to agree with it.
    """
    hit = ctx.probes.get(first)
    if hit is None:
        groups = ([g for g in ctx.cluster.node_groups if g.gpu.name == first]
                  + [g for g in ctx.cluster.node_groups if g.gpu.name != first])
        hit = ctx.probes[first] = rebuild(ctx.cluster, node_groups=groups)
    return hit


def layer_costs(ctx: Ctx, plan: ParallelPlan, first: str,
                gpu: str) -> tuple[float, float, float, float]:
    """(forward, backward, LM-head forward, LM-head backward) seconds of one layer / one
    micro-batch on GPU type ``gpu`` when type ``first`` hosts stage 0 (``layer_cost``)."""
    world = plan.world_size(ctx.cluster.num_gpus)  # the job's parts set its pace
    key = (plan.tp, plan.cp, plan.ep, plan.etp, plan.sequence_parallel, plan.micro_batch_size,
           plan.recompute, plan.tp_comm_overlap, first, gpu, world)
    hit = ctx.costs.get(key)
    if hit is None:
        dev = Device.of_training(ctx.types[gpu].gpu, ctx.training, synced_gpus=world)
        # simulate prices each stage's TP/CP/EP groups on its own GPU type's links, so the
        # cost of type ``gpu`` no longer depends on which type hosts stage 0.
        topo = _probe(ctx, gpu).topology
        cost = layer_cost(ctx.model, topo, ctx.training, plan, dev, moe=ctx.model.is_moe)
        head = head_times(ctx.model, topo, ctx.training, plan, dev)
        hit = ctx.costs[key] = (cost.fwd, cost.bwd, head.fwd, head.bwd)
    return hit


def stage_time(costs: tuple[float, float, float, float], layers: int, last: bool) -> float:
    """Forward + backward seconds of a stage (``simulate``'s arithmetic and order)."""
    fwd, bwd, head_f, head_b = costs
    f, b = layers * fwd, layers * bwd
    if last:
        f, b = f + head_f, b + head_b
    return f + b


def activations(ctx: Ctx, plan: ParallelPlan) -> LayerActivations:
    key = (plan.tp, plan.cp, plan.ep, plan.etp, plan.sequence_parallel, plan.micro_batch_size,
           plan.recompute)
    hit = ctx.acts.get(key)
    if hit is None:
        hit = ctx.acts[key] = layer_activations(ctx.model, ctx.training, plan)
    return hit
