"""Alpha-beta cost of collectives on a group of GPUs, routed over the cluster topology.

Ring algorithms (Thakur et al. 2005; Patarasuk & Yuan 2009): for n ranks, S bytes,
per-step latency alpha and per-rank one-direction bandwidth B,
  all-reduce       2(n-1)*alpha + 2(n-1)/n * S/B
  reduce-scatter    (n-1)*alpha +  (n-1)/n * S/B   (S = the full, unsharded buffer)
  all-gather        (n-1)*alpha +  (n-1)/n * S/B   (S = the gathered result)
  all-to-all        pairwise: each member sends S/n to every other one at once, intra-node
                    shares over its scale-up link and inter-node shares through its own NIC
                    (``pairwise_all_to_all``; S = bytes each rank holds)
  broadcast         log2(n)*alpha + S/B            (pipelined)
  p2p               alpha + S/B
  tree all-reduce   2*ceil(log2 n)*alpha + 2*S/B   (NCCL's double binary tree, Sanders et al.
                    2009: reduce up and broadcast down two complementary trees, each carrying
                    half the data; log latency, ~2S/B bandwidth term)
Hierarchical all-reduce: reduce-scatter inside nodes, all-reduce of S/k across nodes, all-gather
inside nodes (the NCCL/Horovod hierarchy); the cheaper of ring and hierarchy is used, as NCCL
picks algorithms by size; reduce-scatter and all-gather have no tree or hierarchy in NCCL (its
docs list Ring for both, plus NVLS/CollNet in a switch domain and PAT for one GPU per node), so
they run as rings. B and alpha come from ``Topology.ring`` (B: the bottleneck edge, link
efficiency included; alpha: the mean hop latency for rings, as NCCL's tuning model sums the
ring's hop latencies, the slowest hop's for each tree level); kinds other than all-reduce
scale B by the cluster's measured
``collective_efficiency`` (1 unless a profile says otherwise). Times in seconds, sizes in
bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from paraplan.specs.errors import SpecError
from paraplan.specs.topology import RingCost, Topology, boundary_ranks


def overlapped(comm_s: Any, window_s: Any, slowdown: Any) -> Any:
    """Seconds a collective of ``comm_s`` costs when it runs under ``window_s`` of compute:
    what the window cannot hide, plus the share of the covered time the compute loses to the
    communication kernels' SMs (``slowdown``; e.g. ``Device.nccl_slowdown``). Numbers or numpy
    arrays alike (the vectorized search prices every plan with it)."""
    if isinstance(comm_s, np.ndarray) or isinstance(window_s, np.ndarray):
        return np.maximum(0.0, comm_s - window_s) + np.minimum(comm_s, window_s) * slowdown
    return max(0.0, comm_s - window_s) + min(comm_s, window_s) * slowdown


def ring_all_reduce(nbytes: float, n: int, bandwidth_Bps: float, latency_s: float) -> float:
    """Ring all-reduce time, seconds."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * latency_s + 2 * (n - 1) / n * nbytes / bandwidth_Bps


def ring_all_gather(nbytes: float, n: int, bandwidth_Bps: float, latency_s: float) -> float:
    """Ring all-gather (or reduce-scatter) of a ``nbytes`` full buffer, seconds."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * latency_s + (n - 1) / n * nbytes / bandwidth_Bps


ring_reduce_scatter = ring_all_gather


def tree_all_reduce(nbytes: float, n: int, bandwidth_Bps: float, latency_s: float) -> float:
    """Double-binary-tree all-reduce time, seconds (wins for small messages on many ranks)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * latency_s + 2 * nbytes / bandwidth_Bps


def all_to_all(nbytes: float, n: int, bandwidth_Bps: float, latency_s: float) -> float:
    """Pairwise all-to-all where each rank holds ``nbytes`` and keeps 1/n, seconds."""
    return ring_all_gather(nbytes, n, bandwidth_Bps, latency_s)


def broadcast(nbytes: float, n: int, bandwidth_Bps: float, latency_s: float) -> float:
    """Pipelined tree/ring broadcast, seconds."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return math.ceil(math.log2(n)) * latency_s + nbytes / bandwidth_Bps


def p2p(nbytes: float, bandwidth_Bps: float, latency_s: float) -> float:
    """One point-to-point send, seconds."""
    return 0.0 if nbytes <= 0 else latency_s + nbytes / bandwidth_Bps


def _bps(cost: RingCost) -> float:
    return cost.bandwidth_GBps * 1e9


def kind_efficiency(topology: Topology, kind: str) -> float:
    """The cluster's achieved-bandwidth factor for ``kind`` relative to the all-reduce-calibrated
    ring model (``ClusterSpec.collective_efficiency``; 1 when not given)."""
    return topology.cluster.collective_efficiency.get(kind, 1.0)


def group_collective(topology: Topology, group: Sequence[int], kind: str, nbytes: float) -> float:
    """Time of ``kind`` (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast) on
    ``group`` of the topology, ring order as given; all-reduce also tries the hierarchy."""
    n = len(group)
    if n <= 1 or nbytes <= 0:
        return 0.0
    ring = topology.ring(group)
    bw, lat = _bps(ring), ring.latency_s
    if kind == "all_reduce":
        best = ring_all_reduce(nbytes, n, bw, lat)
        if ring.num_nodes > 1:
            # NCCL's double binary tree spans nodes (a chain inside each node), so its log
            # latency only helps across nodes.
            best = min(best, tree_all_reduce(nbytes, n, bw, ring.tree_latency_s))
        hier = topology.hierarchical(group)
        if hier.intra is not None and hier.inter is not None:
            k = hier.gpus_per_node
            t = (2 * ring_all_gather(nbytes, k, _bps(hier.intra), hier.intra.latency_s)
                 + ring_all_reduce(nbytes / k, hier.num_nodes, _bps(hier.inter) / k,
                                   hier.inter.latency_s))
            best = min(best, t)
        return best
    if kind in ("all_gather", "reduce_scatter"):
        return ring_all_gather(nbytes, n, bw * kind_efficiency(topology, kind), lat)
    if kind == "all_to_all":
        return pairwise_all_to_all(topology, group, nbytes)
    if kind == "broadcast":
        return broadcast(nbytes, n, bw * kind_efficiency(topology, kind), ring.tree_latency_s)
    raise ValueError(f"unknown collective {kind!r}")


def pairwise_all_to_all(topology: Topology, group: Sequence[int], nbytes: float) -> float:
    """All-to-all where each member holds ``nbytes`` and sends ``nbytes / n`` to every other
    member directly, seconds.

    NCCL's all-to-all is one group of point-to-point sends and receives to every peer, all
    posted at once (nccl-tests ``alltoall``: ``ncclSend``/``ncclRecv`` per peer inside
    ``ncclGroupStart``/``End``), so a member's intra-node shares move over its own scale-up
    link while its inter-node shares leave through its own NIC share (DGX/HGX are rail
    optimised: one NIC per GPU, ``Topology.pair_matrix``), at the same time: the slower of
    the two paces it, and the slowest member paces the group. Unlike a ring collective, a
    pairwise exchange cannot pool the node's NICs: every GPU's cross-node bytes are its own.
    One latency per tier (the sends are concurrent)."""
    if len(group) <= 1 or nbytes <= 0:
        return 0.0
    intra, inter = _a2a_lines(topology, group)
    share = nbytes / len(group)
    return max(alpha + beta * share for alpha, beta in intra + inter)


def forwarded_all_to_all(topology: Topology, group: Sequence[int], inter_bytes: float,
                         intra_bytes: float) -> float:
    """Hierarchical (node-deduplicated) all-to-all, seconds: each member sends
    ``inter_bytes`` through its own NIC share to the other nodes (once per destination node)
    while ``intra_bytes`` move over the scale-up links (the forwarding to the experts' GPUs
    inside a node), at the same time (DeepEP internode "normal" kernels: RDMA to the
    same-index GPU of each destination node, NVLink forwarding there; DeepEP README).
    Bandwidths as ``pairwise_all_to_all``; one latency per tier."""
    if len(group) <= 1 or (inter_bytes <= 0 and intra_bytes <= 0):
        return 0.0
    intra, inter = _a2a_lines(topology, group, slowest_peer=True)
    return max([a + b * intra_bytes for a, b in intra if intra_bytes > 0]
               + [a + b * inter_bytes for a, b in inter if inter_bytes > 0] + [0.0])


def _a2a_lines(topology: Topology, group: Sequence[int], slowest_peer: bool = False
               ) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Distinct (latency s, seconds per byte) of every member's scale-up and inter-node
    tiers, memoized per group. ``slowest_peer=False``: seconds per byte sent to each peer of
    the tier, summed over its peers (``pairwise_all_to_all``); True: of the tier's slowest
    link (``forwarded_all_to_all``)."""
    key = (group if isinstance(group, tuple) else tuple(int(g) for g in group), slowest_peer)
    return topology.memoized("a2a", key, _a2a_lines_of(topology))  # type: ignore


def _a2a_lines_of(topology: Topology):
    def lines(key: tuple[tuple[int, ...], bool]):
        group, slowest_peer = key
        members = np.asarray(group, dtype=np.int64)
        n = members.size
        bw, lat = topology.pair_matrix(group)
        node = topology.node_of_gpu[members]
        same = node[:, None] == node[None, :]
        other = ~np.eye(n, dtype=bool)
        per_byte = 1.0 / (bw * 1e9 * kind_efficiency(topology, "all_to_all"))  # 0 on diagonal
        # In a switchless node each peer has links of its own (``specs.mesh``): the shares
        # move in parallel, so the slowest peer paces the scale-up tier, not their sum.
        mesh = topology.on_mesh(members)
        out = []
        for i, tier in enumerate((same & other, ~same)):
            rows = tier.any(axis=1)
            if not rows.any():
                out.append([])
                continue
            each = np.where(tier, per_byte, 0.0)
            parallel = slowest_peer or (mesh if i == 0 else False)
            beta = np.where(parallel, each.max(axis=1), each.sum(axis=1))[rows]
            alpha = np.where(tier, lat, 0.0).max(axis=1)[rows]
            out.append(sorted({(float(a), float(b)) for a, b in zip(alpha, beta, strict=True)}))
        return tuple(out)
    return lines


PS_MAX_MEMBERS = 4096


def _pair_seconds(topology: Topology, group: Sequence[int], nbytes: float
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """(latency s, transfer s of ``nbytes``) between every ordered pair of ``group``, zero on
    the diagonal; None for a group of one or nothing to send."""
    n = len(group)
    if n <= 1 or nbytes <= 0:
        return None
    if n > PS_MAX_MEMBERS:
        raise SpecError(f"dp_algorithm ps / sharded_ps is priced for data-parallel groups of up "
                        f"to {PS_MAX_MEMBERS} members (pairwise); this one has {n}",
                        field="plan.dp_algorithm", value=n)
    bw, lat = topology.pair_matrix(tuple(int(g) for g in group))
    with np.errstate(divide="ignore"):
        per = nbytes / (bw * 1e9 * kind_efficiency(topology, "p2p"))
    lat, per = lat.copy(), per.copy()
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(per, 0.0)
    return lat, per


def sharded_ps_all_reduce(topology: Topology, group: Sequence[int], nbytes: float) -> float:
    """Sharded parameter server (DT-FM's data-parallel exchange): every member owns 1/n of the
    buffer; it receives the other members' copies of its shard and sends the reduced shard
    back. Each pair's transfers run concurrently at that pair's bandwidth (DT-FM's per-pair
    network model; NIC sharing between a member's streams is not modelled), so each of the
    two phases lasts as long as the slowest pair: 2 * max_ij (alpha_ij + S/n / B_ij). On
    high-latency WANs this pays 2 latencies where a ring pays 2(n-1). Seconds."""
    mats = _pair_seconds(topology, group, nbytes / max(1, len(group)))
    if mats is None:
        return 0.0
    lat, per = mats
    return 2.0 * float((lat + per).max())


def ps_all_reduce(topology: Topology, group: Sequence[int], nbytes: float) -> float:
    """One parameter server (the best-connected member): the other n-1 members send it the
    whole buffer and fetch the result; the server's transfers share its link, one after the
    other: 2 * (max_j alpha_0j + sum_j S / B_0j). Seconds."""
    mats = _pair_seconds(topology, group, nbytes)
    if mats is None:
        return 0.0
    lat, per = mats
    return 2.0 * float(np.min(lat.max(axis=1) + per.sum(axis=1)))


def pipeline_p2p_lines(topology: Topology, span: int, stages: int, stride: int,
                       placement: Sequence[int] | None = None) -> list[tuple[float, float]]:
    """Distinct (latency s, bandwidth bytes/s, p2p efficiency included) of the pipeline sends
    between consecutive stages of ``span`` ranks, every replica and boundary at once. Ranks
    sit on the GPUs of the same index, or on ``placement[rank]``."""
    eff = kind_efficiency(topology, "p2p")
    if placement is None:
        lines = topology.stage_boundaries(span, stages, stride)
    else:
        src, dst = boundary_ranks(span, stages, stride)
        place = np.asarray(placement, dtype=np.int64)
        lines = topology.pair_lines(place[src], place[dst])
    return [(lat, bw * 1e9 * eff) for lat, bw in lines]


def pipeline_p2p(topology: Topology, span: int, stages: int, stride: int, nbytes: float,
                 placement: Sequence[int] | None = None) -> float:
    """Seconds of one pipeline send of ``nbytes`` per rank: the slowest stage boundary's pair
    paces the pipeline in steady state (DT-FM sec 3's bottleneck matching), so it is charged
    on every send (``pipeline_p2p_lines``)."""
    lines = pipeline_p2p_lines(topology, span, stages, stride, placement)
    return max((p2p(nbytes, bps, lat) for lat, bps in lines), default=0.0)


def tied_embedding_lines(topology: Topology, span: int, stages: int,
                         placement: Sequence[int] | None = None) -> list[tuple[float, float]]:
    """Distinct (latency s, bandwidth bytes/s) of the pairs that all-reduce the gradient of a
    word embedding with a copy on the last stage (tied, or MTP's): rank ``i`` of the first
    stage with rank ``i`` of the last, for every ``i`` of a stage's ``span`` ranks at once
    (Megatron's embedding group holds one rank of each end of a pipeline:
    megatron/core/parallel_state.py ``embedding_ranks``); empty for a single stage. Ranks
    sit on the GPUs of the same index, or on ``placement[rank]``."""
    if stages <= 1:
        return []
    src = np.arange(span, dtype=np.int64)
    dst = src + (stages - 1) * span
    if placement is not None:
        place = np.asarray(placement, dtype=np.int64)
        src, dst = place[src], place[dst]
    eff = kind_efficiency(topology, "all_reduce")
    return [(lat, bw * 1e9 * eff) for lat, bw in topology.pair_lines(src, dst)]


def tied_embedding_all_reduce(topology: Topology, span: int, stages: int, nbytes: float,
                              placement: Sequence[int] | None = None) -> float:
    """Seconds of the embedding-gradient all-reduce of ``nbytes`` per rank
    (``tied_embedding_lines``): a ring of two, 2 alpha + S / B (each rank sends half the
    buffer in the reduce-scatter and half in the all-gather), on the slowest pair."""
    if nbytes <= 0:
        return 0.0
    return max((2 * lat + nbytes / bps
                for lat, bps in tied_embedding_lines(topology, span, stages, placement)),
               default=0.0)


def collective_lines(topology: Topology, group: Sequence[int], kind: str,
                     ) -> list[tuple[float, float]]:
    """``group_collective`` as lines: ``time(S) = min(alpha + beta * S)`` over the algorithms.

    Every algorithm above is affine in the message size S (bytes) on a fixed group, so a
    collective is the lower envelope of its algorithms' lines; ``k`` equal chunks cost
    ``min(k * alpha + beta * S)``. Returns [(alpha seconds, beta seconds per byte)], empty for
    a group of one (time 0). The vectorized search evaluates collectives from these lines.
    All-to-all is a maximum over members, not an envelope: ``pairwise_all_to_all``.
    """
    n = len(group)
    if n <= 1:
        return []
    ring = topology.ring(group)
    bw, lat = _bps(ring), ring.latency_s
    if kind == "all_reduce":
        lines = [(2 * (n - 1) * lat, 2 * (n - 1) / n / bw)]
        if ring.num_nodes > 1:
            lines.append((2 * math.ceil(math.log2(n)) * ring.tree_latency_s, 2 / bw))
        hier = topology.hierarchical(group)
        if hier.intra is not None and hier.inter is not None:
            k, nn = hier.gpus_per_node, hier.num_nodes
            intra_bw, inter_bw = _bps(hier.intra), _bps(hier.inter) / k
            alpha, beta = 0.0, 0.0
            if k > 1:
                alpha += 2 * (k - 1) * hier.intra.latency_s
                beta += 2 * (k - 1) / k / intra_bw
            if nn > 1:
                alpha += 2 * (nn - 1) * hier.inter.latency_s
                beta += 2 * (nn - 1) / nn / k / inter_bw
            lines.append((alpha, beta))
        return lines
    if kind in ("all_gather", "reduce_scatter"):
        return [((n - 1) * lat, (n - 1) / n / (bw * kind_efficiency(topology, kind)))]
    if kind == "broadcast":
        return [(math.ceil(math.log2(n)) * ring.tree_latency_s,
                 1 / (bw * kind_efficiency(topology, kind)))]
    raise ValueError(f"unknown collective {kind!r}")
