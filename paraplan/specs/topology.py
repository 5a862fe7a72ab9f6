# longer than 400 lines: one Topology class answers every tier's pair, ring and hierarchy costs.
"""Topology of a cluster: who is connected to whom, how fast, and collective bottlenecks.

GPUs are numbered 0..N-1 node by node, group by group (the order of ``node_groups``). Three
tiers separate two GPUs:

* ``intra_node``: the node's scale-up link (NVLink/PCIe), per GPU, one direction;
* ``intra_region``: through the NICs into the region's fabric. A GPU's share of its node's NIC
  bandwidth is ``nics_per_node * nic_bandwidth / gpus_per_node`` (all GPUs sending at once),
  or the cluster's fixed ``intra_region_link`` per GPU pair (DT-FM's simulation model);
* ``inter_region``: the WAN link of the region pair (per GPU pair, DT-FM convention), capped by
  the NIC share.

Inside a switchless node (``NodeGroup.peer_bandwidth_GBps``) a send between two GPUs moves over
their direct links and a ring collective over the links between its members (``specs.mesh``).

Lookups are O(1) per pair and O(n) for a group (numpy over the group); nothing is quadratic in
the cluster size, so 16,384 GPUs are cheap. ``to_networkx()`` builds the explicit graph (GPUs,
node switches, NICs, region fabrics, WAN edges) with a number of vertices linear in N.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from paraplan.specs.errors import SpecError
from paraplan.specs.mesh import host_bandwidths, mesh_capped, mesh_pairs, peer_matrices

if TYPE_CHECKING:  # annotations only: ClusterSpec builds its Topology (cluster -> topology)
    from paraplan.specs.cluster import ClusterSpec

TIERS = ("self", "intra_node", "intra_region", "inter_region")


@dataclass(frozen=True)
class PathCost:
    """Point-to-point bandwidth (one direction, GB/s, after link efficiency) and latency (s)."""

    bandwidth_GBps: float
    latency_s: float
    tier: str


@dataclass(frozen=True)
class RingCost:
    """Bottleneck of a ring over a group, in ring order.

    ``bandwidth_GBps`` is the slowest ring edge's effective one-direction bandwidth (GB/s,
    after link efficiency) available to one rank; ``latency_s`` the mean edge latency: a
    chunk crosses the edges one after another, paying each hop's latency once (NCCL's model,
    src/graph/tuning.cc: (nsteps - nInterSteps) * intraLat + nInterSteps * interLat).
    """

    n: int
    bandwidth_GBps: float
    latency_s: float
    tier: str
    num_nodes: int
    max_gpus_per_node: int
    slowest_hop_latency_s: float | None = None
    """The slowest edge's latency (None: ``latency_s``), which a tree pays at every level
    (NCCL's tree model counts ``interLat`` per level above the node)."""

    @property
    def tree_latency_s(self) -> float:
        """Per-level latency of a tree or pipelined broadcast over this group, seconds."""
        return self.slowest_hop_latency_s or self.latency_s


@dataclass(frozen=True)
class HierarchicalCost:
    """Two-level view of a group: rings inside nodes, then one ring across nodes.

    ``intra`` covers the k = ``gpus_per_node`` members of the group inside each node (None if
    every node holds one member); ``inter`` the ring over the ``num_nodes`` nodes, whose
    bandwidth per node is k times each member's NIC share (NCCL runs one channel per NIC).
    """

    gpus_per_node: int
    num_nodes: int
    intra: RingCost | None
    inter: RingCost | None


def boundary_ranks(span: int, stages: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(senders, receivers) of the pipeline sends between consecutive stages of ``span``
    ranks: rank ``r*span + stride*i`` sends to the one ``span`` further on (one send per TP
    group, ``stride`` = tp); empty for a single stage."""
    if stages <= 1:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    src = (np.arange(stages - 1)[:, None] * span + np.arange(0, span, stride)[None, :]).ravel()
    return src, src + span


class Topology:
    """Answers bandwidth/latency questions about a ClusterSpec. Build with ``Topology(cluster)``."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        groups = cluster.node_groups
        regions = cluster.regions
        self.region_names = regions
        region_index = {r: i for i, r in enumerate(regions)}

        node_group = np.repeat(np.arange(len(groups)), [g.num_nodes for g in groups])
        gpn = np.array([g.gpus_per_node for g in groups])
        self.node_group = node_group
        self.node_of_gpu = np.repeat(np.arange(len(node_group)), gpn[node_group])
        self.group_of_gpu = node_group[self.node_of_gpu]
        self.num_gpus = int(self.node_of_gpu.size)

        # Per node-group properties (small arrays indexed by group).
        self._region = np.array([region_index[g.region] for g in groups])
        self._intra_bw = np.array(
            [
                (g.intra_node_link.bandwidth_GBps * g.intra_node_link.efficiency)
                if g.intra_node_link
                else np.inf
                for g in groups
            ]
        )
        self._intra_lat = np.array(
            [g.intra_node_link.latency_s if g.intra_node_link else 0.0 for g in groups]
        )
        self._nic_share = np.array(
            [g.nic_bandwidth_per_gpu_GBps * g.inter_node_link.efficiency for g in groups]
        )
        self._nic_bw = np.array(
            [g.inter_node_link.bandwidth_GBps * g.inter_node_link.efficiency for g in groups]
        )
        self._nic_total = np.array(
            [g.nics_per_node * g.inter_node_link.bandwidth_GBps * g.inter_node_link.efficiency
             for g in groups]
        )
        self._nic_lat = np.array([g.inter_node_link.latency_s for g in groups])
        self._peer = peer_matrices(groups)  # switchless nodes' links (specs.mesh)
        self._switchless = np.array([p is not None for p in self._peer], dtype=bool)
        self._host_bw = host_bandwidths(groups)  # their GPU -> host/NIC path
        self._node_first = np.searchsorted(self.node_of_gpu, np.arange(node_group.size))

        r = len(regions)
        self._wan_bw = np.full((r, r), np.inf)
        self._wan_lat = np.zeros((r, r))
        for link in cluster.region_links:
            i, j = region_index[link.a], region_index[link.b]
            self._wan_bw[i, j] = self._wan_bw[j, i] = link.bandwidth_Gbps / 8.0
            self._wan_lat[i, j] = self._wan_lat[j, i] = link.latency_ms * 1e-3
        irl = cluster.intra_region_link
        self._region_pair_bw = irl.bandwidth_GBps * irl.efficiency if irl else None
        self._region_pair_lat = irl.latency_s if irl else None
        # Memo of ring/hierarchy answers per group (searchers ask the same groups repeatedly).
        self._memo: dict[tuple, object] = {}

    # ---- point to point ------------------------------------------------------------------
    def _check(self, gpus: np.ndarray) -> None:
        if gpus.size and (gpus.min() < 0 or gpus.max() >= self.num_gpus):
            bad = int(gpus[(gpus < 0) | (gpus >= self.num_gpus)][0])
            raise SpecError(
                f"GPU index {bad} is outside the cluster's range 0..{self.num_gpus - 1}",
                field="gpu", value=bad, allowed=f"0..{self.num_gpus - 1}",
            )

    def _pairs(
        self, a: np.ndarray, b: np.ndarray, *, shared: bool, k_per_node: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorized pair cost: (bandwidth GB/s, latency s, tier index) for a[i] -> b[i]."""
        ga, gb = self.group_of_gpu[a], self.group_of_gpu[b]
        same_gpu = a == b
        same_node = self.node_of_gpu[a] == self.node_of_gpu[b]
        ra, rb = self._region[ga], self._region[gb]
        same_region = ra == rb

        intra_bw = np.minimum(self._intra_bw[ga], self._intra_bw[gb])
        if shared:
            nic = np.minimum(self._nic_share[ga], self._nic_share[gb])
            if k_per_node is not None:  # k members per node use k NICs' worth of bandwidth
                nic = np.minimum(nic * k_per_node, np.minimum(self._nic_total[ga],
                                                              self._nic_total[gb]))
        else:
            nic = np.minimum(self._nic_bw[ga], self._nic_bw[gb])
        # The GPU reaches its NIC through the node's scale-up fabric (PCIe/NVLink switch),
        # or a switchless node's host link.
        fabric_bw = np.minimum(nic, np.minimum(self._host_bw[ga], self._host_bw[gb]))
        fabric_lat = np.maximum(self._nic_lat[ga], self._nic_lat[gb])
        if self._region_pair_bw is not None:
            fabric_bw = np.minimum(fabric_bw, self._region_pair_bw)
            fabric_lat = np.full(a.shape, self._region_pair_lat)
        wan_bw = np.minimum(fabric_bw, self._wan_bw[ra, rb])
        wan_lat = self._wan_lat[ra, rb]

        bw = np.where(same_node, mesh_pairs(self, a, b, same_node, intra_bw),
                      np.where(same_region, fabric_bw, wan_bw))
        lat = np.where(
            same_node,
            np.maximum(self._intra_lat[ga], self._intra_lat[gb]),
            np.where(same_region, fabric_lat, wan_lat),
        )
        tier = np.where(same_gpu, 0, np.where(same_node, 1, np.where(same_region, 2, 3)))
        bw = np.where(same_gpu, np.inf, bw)
        lat = np.where(same_gpu, 0.0, lat)
        return bw, lat, tier

    def stage_boundaries(self, span: int, stages: int, stride: int = 1
                         ) -> list[tuple[float, float]]:
        """Distinct (latency s, bandwidth GB/s) of the pipeline sends in rank order: stage
        ``r`` holds ranks ``[r*span, (r+1)*span)`` on the GPUs of the same index, and rank
        ``r*span + stride*i`` sends to the one ``span`` further on, all at once (Megatron's
        scatter-gather: one send per TP group, ``stride`` = tp). The slowest of these paces
        the pipeline, so a plan whose stages cross a WAN pays the WAN hop even when its first
        boundary sits inside a node or a region."""
        key = (int(span), int(stages), int(stride))
        return self._memoized("bounds", key, self._stage_boundaries)  # type: ignore[return-value]

    def _stage_boundaries(self, key: tuple[int, int, int]) -> list[tuple[float, float]]:
        src, dst = boundary_ranks(*key)
        return self.pair_lines(src, dst)

    def pair_lines(self, src: np.ndarray, dst: np.ndarray) -> list[tuple[float, float]]:
        """Distinct (latency s, bandwidth GB/s) of the sends ``src[i] -> dst[i]`` (GPU
        indices), all at once (shared NICs); empty for no sends."""
        if src.size == 0:
            return []
        self._check(np.concatenate([src, dst]))
        bw, lat, _ = self._pairs(src, dst, shared=True)
        rows = np.unique(np.stack([lat, bw], axis=1), axis=0)
        return [(float(a), float(b)) for a, b in rows]

    def pair_matrix(self, group: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(bandwidth GB/s, latency s) between every ordered pair of ``group`` (n x n; the
        diagonal is inf / 0), all GPUs communicating at once (shared NICs)."""
        return self._memoized("matrix", group, self._pair_matrix)  # type: ignore[return-value]

    def _pair_matrix(self, group: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        arr = self._group(group)
        n = arr.size
        a, b = np.repeat(arr, n), np.tile(arr, n)
        bw, lat, _ = self._pairs(a, b, shared=True)
        return bw.reshape(n, n), lat.reshape(n, n)

    def pair(self, a: int, b: int, *, shared: bool = True) -> PathCost:
        """Cost from GPU ``a`` to GPU ``b``.

        Args:
            shared: True (default) gives each GPU its fair share of the node's NICs, as when
                every GPU communicates at once (collectives); False gives one full NIC.
        """
        return self._memoized(f"pair{shared}", (int(a), int(b)),  # type: ignore[return-value]
                              lambda ab: self._pair(ab[0], ab[1], shared))

    def _pair(self, a: int, b: int, shared: bool) -> PathCost:
        arr_a, arr_b = np.array([a]), np.array([b])
        self._check(np.concatenate([arr_a, arr_b]))
        bw, lat, tier = self._pairs(arr_a, arr_b, shared=shared)
        return PathCost(float(bw[0]), float(lat[0]), TIERS[int(tier[0])])

    # ---- collectives -----------------------------------------------------------------------
    def _group(self, group: Sequence[int]) -> np.ndarray:
        arr = np.asarray(group, dtype=np.int64).ravel()
        if arr.size == 0:
            raise SpecError("a communication group needs at least one GPU", field="group")
        self._check(arr)
        if np.unique(arr).size != arr.size:
            raise SpecError("a communication group lists a GPU twice", field="group")
        return arr

    def memoized(self, kind: str, key: tuple, fn) -> object:
        """``fn(key)``, computed once per topology (derived costs of a group, e.g. the
        all-to-all lines of ``simulator.collectives``)."""
        return self._memoized(kind, key, fn)

    def _memoized(self, kind: str, group: Sequence[int], fn) -> object:
        key = (kind, group if isinstance(group, tuple) else tuple(np.asarray(group).tolist()))
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) > 4096:
                self._memo.clear()
            hit = self._memo[key] = fn(group)
        return hit

    def ring(self, group: Sequence[int]) -> RingCost:
        """Bottleneck of a ring visiting ``group`` in the given order (order matters on WANs).

        When k members share a node, NCCL drives k channels through k NICs, so inter-node ring
        edges get k times one member's NIC share (capped by the node's NICs).
        """
        return self._memoized("ring", group, self._ring)  # type: ignore[return-value]

    def _ring(self, group: Sequence[int]) -> RingCost:
        arr = self._group(group)
        n = int(arr.size)
        nodes, counts = np.unique(self.node_of_gpu[arr], return_counts=True)
        k_max = int(counts.max())
        if n == 1:
            return RingCost(1, float("inf"), 0.0, "self", 1, 1)
        per_node = dict(zip(nodes.tolist(), counts.tolist(), strict=True))
        k = np.array([per_node[int(x)] for x in self.node_of_gpu[arr]], dtype=float)
        nxt = np.roll(arr, -1)
        bw, lat, tier = self._pairs(arr, nxt, shared=True, k_per_node=k)
        bw = mesh_capped(self, arr, nxt, bw)
        worst = int(np.argmin(bw))
        return RingCost(n, float(bw[worst]), float(lat.mean()), TIERS[int(tier.max())],
                        int(nodes.size), k_max, float(lat.max()))

    def on_mesh(self, gpus: np.ndarray) -> np.ndarray:
        """For each GPU, whether its node is switchless (``NodeGroup.peer_bandwidth_GBps``)."""
        return self._switchless[self.group_of_gpu[gpus]]

    def p2p_ring(self, group: Sequence[int]) -> RingCost:
        """Bottleneck of a ring of point-to-point sends, each rank to the next (context
        parallelism's ring attention: TransformerEngine's ``cp_comm_type="p2p"`` passes K/V with
        ``batch_isend_irecv``). Unlike a collective's ring (``ring``), whose channels NCCL
        spreads over every NIC of the node, one send between two GPUs crosses nodes through
        the NIC nearest the sender (NCCL's per-peer network channels share it), so an
        inter-node edge gets one GPU's NIC share however many members the node holds."""
        return self._memoized("p2p_ring", group, self._p2p_ring)  # type: ignore[return-value]

    def _p2p_ring(self, group: Sequence[int]) -> RingCost:
        arr = self._group(group)
        if arr.size == 1:
            return RingCost(1, float("inf"), 0.0, "self", 1, 1)
        bw, lat, tier = self._pairs(arr, np.roll(arr, -1), shared=True)
        worst = int(np.argmin(bw))
        return RingCost(int(arr.size), float(bw[worst]), float(lat.max()),
                        TIERS[int(tier.max())], int(np.unique(self.node_of_gpu[arr]).size), 1)

    def hierarchical(self, group: Sequence[int]) -> HierarchicalCost:
        """Split ``group`` into per-node rings and one ring across nodes (first member each)."""
        return self._memoized("hier", group, self._hierarchical)  # type: ignore[return-value]

    def _hierarchical(self, group: Sequence[int]) -> HierarchicalCost:
        arr = self._group(group)
        node_ids = self.node_of_gpu[arr]
        nodes, first_idx, counts = np.unique(node_ids, return_index=True, return_counts=True)
        k = int(counts.max())
        intra = None
        if k > 1:
            # The slowest node's ring decides (all run concurrently). All per-node rings are
            # costed in one vectorized pass; the first node with the smallest bottleneck wins.
            order = np.argsort(node_ids, kind="stable")
            srt, starts = arr[order], np.repeat(np.searchsorted(node_ids[order], nodes), counts)
            size = np.repeat(counts, counts)
            nxt = srt[starts + (np.arange(srt.size) - starts + 1) % size]
            multi = size > 1
            bw, _, _ = self._pairs(srt[multi], nxt[multi], shared=True,
                                   k_per_node=size[multi].astype(float))
            seg = np.concatenate([[0], np.cumsum(counts[counts > 1])[:-1]])
            node = nodes[counts > 1][int(np.argmin(np.minimum.reduceat(bw, seg)))]
            intra = self.ring(arr[node_ids == node])
        inter = None
        if nodes.size > 1:
            leaders = arr[np.sort(first_idx)]
            kk = np.array([counts[np.searchsorted(nodes, self.node_of_gpu[g])] for g in leaders],
                          dtype=float)
            bw, lat, tier = self._pairs(leaders, np.roll(leaders, -1), shared=True,
                                        k_per_node=kk)
            inter = RingCost(int(leaders.size), float(bw.min()), float(lat.mean()),
                             TIERS[int(tier.max())], int(nodes.size), 1, float(lat.max()))
        return HierarchicalCost(k, int(nodes.size), intra, inter)

    # ---- explicit graph --------------------------------------------------------------------
    @cached_property
    def graph(self) -> nx.Graph:
        """networkx graph: ``gpu:i``, ``node:n`` (switch), ``nic:n:j``, ``fabric:region``.

        Edges carry ``bandwidth_GBps`` (one direction, nominal; one NIC per ``nic`` edge) and
        ``latency_s``. Vertices and edges are linear in the GPU count.
        """
        g = nx.Graph()
        cluster = self.cluster
        irl = cluster.intra_region_link
        for region in self.region_names:
            g.add_node(f"fabric:{region}", kind="fabric", region=region)
        gpu = 0
        node = 0
        for gi, group in enumerate(cluster.node_groups):
            link = group.intra_node_link
            for _ in range(group.num_nodes):
                sw = f"node:{node}"
                g.add_node(sw, kind="switch", group=gi, region=group.region)
                for _ in range(group.gpus_per_node):
                    g.add_node(f"gpu:{gpu}", kind="gpu", gpu=group.gpu.name, node=node)
                    g.add_edge(
                        f"gpu:{gpu}", sw, bandwidth_GBps=float(self._host_bw[gi]),
                        latency_s=link.latency_s / 2 if link else 0.0,
                    )
                    gpu += 1
                peer = self._peer[gi]
                for i, j in zip(*np.nonzero(np.triu(peer)) if peer is not None else ((), ()),
                                strict=True):  # a switchless node's direct links
                    g.add_edge(f"gpu:{gpu - group.gpus_per_node + i}",
                               f"gpu:{gpu - group.gpus_per_node + j}",
                               bandwidth_GBps=float(peer[i, j]), latency_s=link.latency_s)
                for j in range(group.nics_per_node):
                    nic = f"nic:{node}:{j}"
                    nic_link = group.inter_node_link
                    bw = nic_link.bandwidth_GBps * nic_link.efficiency
                    lat = nic_link.latency_s / 2
                    if irl is not None:
                        bw = min(bw, irl.bandwidth_GBps * irl.efficiency)
                        lat = irl.latency_s / 2
                    g.add_node(nic, kind="nic", node=node)
                    g.add_edge(sw, nic, bandwidth_GBps=np.inf, latency_s=0.0)
                    g.add_edge(nic, f"fabric:{group.region}", bandwidth_GBps=bw, latency_s=lat)
                node += 1
        for link in cluster.region_links:
            g.add_edge(f"fabric:{link.a}", f"fabric:{link.b}",
                       bandwidth_GBps=link.bandwidth_Gbps / 8, latency_s=link.latency_ms * 1e-3)
        return g

    def graph_path_bandwidth(self, a: int, b: int) -> float:
        """Bottleneck bandwidth (GB/s) of the fewest-hop path between two GPUs in the graph."""
        path = nx.shortest_path(self.graph, f"gpu:{a}", f"gpu:{b}")
        return float(min(self.graph.edges[u, v]["bandwidth_GBps"]
                         for u, v in zip(path, path[1:], strict=False)))
