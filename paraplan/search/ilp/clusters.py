"""The cluster a pipeline plan actually uses: node groups reordered and trimmed so stage k lands on
its GPU type."""

from __future__ import annotations

from collections.abc import Sequence

from paraplan.search.ilp.context import rebuild
from paraplan.specs.cluster import ClusterSpec, NodeGroup
from paraplan.specs.errors import SpecError
from paraplan.specs.mesh import cut_node


def take_gpus(cluster: ClusterSpec, gpu: str, start: int, count: int) -> list[NodeGroup]:
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
                                            "nics_per_node": nics,
                                            **cut_node(g, a % gpn, k)}))
            a += k
        pos += g.num_gpus
    return out


def assemble(cluster: ClusterSpec, groups: list[NodeGroup], suffix: str) -> ClusterSpec:
    regions = {g.region for g in groups}
    links = [r for r in cluster.region_links if r.a in regions and r.b in regions]
    return rebuild(cluster, name=f"{cluster.name}-{suffix}", node_groups=groups,
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
        groups += take_gpus(cluster, g, 0, n * gpus_per_stage)
    return assemble(cluster, groups, "ilp")
