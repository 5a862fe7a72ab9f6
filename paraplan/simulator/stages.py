"""How a plan lays the model over its pipeline: layers per model chunk and per rank, and the GPU
types each stage's ranks sit on."""

from __future__ import annotations

from typing import Any

import numpy as np

from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan


def even_split(num_layers: int, chunks: int) -> list[int]:
    """Layers per chunk, as even as possible (earlier chunks get the remainder)."""
    base, rem = divmod(num_layers, chunks)
    return [base + (1 if i < rem else 0) for i in range(chunks)]


def accounted_split(num_layers: int, pp: int, vpp: int) -> list[int] | None:
    """Decoder layers per pipeline chunk (model order) with the embedding and the loss each
    counted as a layer (Megatron-Core ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split``): transformer_block.py get_num_layers_to_build
    gives each rank (layers + 2) / pp, each of its chunks 1 / vpp of that, one fewer in the
    first chunk (the embedding) and in the last (the loss), which may then hold none. None
    where Megatron would refuse the sizes."""
    total = num_layers + 2
    if pp < 1 or vpp < 1 or total % pp or (total // pp) % vpp:
        return None
    chunks = [total // pp // vpp] * (pp * vpp)
    chunks[0] -= 1
    chunks[-1] -= 1
    return chunks if min(chunks) >= 0 else None


def pipeline_chunks(num_layers: int, pp: int, vpp: int) -> list[int] | None:
    """The layer split a search gives a (pp, vpp) shape: equal chunks where the layers divide;
    otherwise, without interleaving, ``even_split`` (earlier stages one more layer), and with
    it Megatron-Core's ``accounted_split`` (None where that does not exist either)."""
    if num_layers % (pp * vpp) == 0 or vpp == 1:
        return even_split(num_layers, pp * vpp)
    return accounted_split(num_layers, pp, vpp)


def plan_chunks(model: ModelSpec, plan: ParallelPlan) -> tuple[list[int], list[int]]:
    """(layers of each of the pp*vpp model chunks, layers held by each pipeline rank): the
    plan's explicit split or ``even_split``; rank r holds chunks r, r+pp, r+2pp, ...
    (Megatron's interleaved assignment)."""
    p, v = plan.pp, plan.virtual_stages
    chunks = list(plan.layers_per_stage or even_split(model.num_layers, p * v))
    return chunks, [sum(chunks[c * p + r] for c in range(v)) for r in range(p)]


def stage_gpu_types(cluster: ClusterSpec, plan: ParallelPlan, p: int, span_ranks: int,
                    ) -> tuple[list[dict[str, Any]], list[dict[str, int]]]:
    """Each stage's GPU types (name -> GPUSpec) and, per type, the first rank of the stage's
    first TP*CP group on that type (``layer_cost``'s ``base_rank``).

    On one GPU type every TP/CP/EP group is priced on the first one (rank order, as the
    vectorized search does). On a mixed cluster each stage's groups of each GPU type are
    priced on the first such group in that stage (its own node links). Stage r is the block
    of ranks [r*span_ranks, (r+1)*span_ranks), on the GPUs ``plan.placement`` maps them to.
    """
    if len(cluster.gpu_types) == 1:
        return [{cluster.gpu.name: cluster.gpu}] * p, [{cluster.gpu.name: 0}] * p
    topo = cluster.topology
    place = None if plan.placement is None else np.asarray(plan.placement, dtype=np.int64)
    unit = plan.tp * plan.cp
    stage_gpus: list[dict[str, Any]] = []
    stage_base: list[dict[str, int]] = []
    for r in range(p):
        block = np.arange(r * span_ranks, (r + 1) * span_ranks)
        gids = topo.group_of_gpu[block if place is None else place[block]]
        types: dict[str, Any] = {}
        bases: dict[str, int] = {}
        for j, g in enumerate(gids[::unit].tolist()):
            bases.setdefault(cluster.node_groups[int(g)].gpu.name, r * span_ranks + j * unit)
        for g in np.unique(gids).tolist():
            gpu = cluster.node_groups[int(g)].gpu
            types[gpu.name] = gpu
            bases.setdefault(gpu.name, r * span_ranks)
        stage_gpus.append(types)
        stage_base.append(bases)
    return stage_gpus, stage_base
