"""Ring bandwidth inside a node whose GPUs are joined by direct links, not a switch.

In an NVSwitch node any group of GPUs reaches the switch through all of each GPU's links, so
a ring collective over two GPUs runs as fast as one over eight. Without a switch (DGX-1 /
AWS p3.16xlarge's NVLink "hybrid cube mesh", AMD MI300X / MI355X's xGMI full mesh, GH200
quads) a collective can only use the links *between its own members*: NCCL's rings hop from
member to member over direct links, as many rings (channels) as the links allow. Each ring
takes one outgoing and one incoming link share at every member, so the rings' total
bandwidth per GPU is at most the least member's link bandwidth to the other members (a
member with fewer links to the group throttles every ring through it):

    ring bandwidth(S) = min_{i in S} sum_{j in S, j != i} B_ij        (one direction, GB/s)

For the hybrid cube mesh this bound is reached: DGX-1's pair GPU0-GPU1 shares one 25 GB/s
NVLink (``nvidia-smi topo -m``: NV1), its quad GPU0-3 packs two rings each way on four
links per GPU (100 GB/s), all eight GPUs six (150 GB/s). On MI300X's full mesh of 64 GB/s
links a group of k GPUs gets (k - 1) x 64 GB/s: stas00's all_reduce_bench measures 47.7 GB/s
bus bandwidth on 2 GPUs and 312.9 on 8, 0.745 and 0.698 of 64 and 448, the same efficiency
the xgmi3 profile applies to both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # annotations only: the topology calls in here
    from paraplan.specs.cluster import NodeGroup
    from paraplan.specs.topology import Topology


def check_peer_matrix(matrix: Sequence[Sequence[float]], gpus_per_node: int, *,
                      host: bool = False) -> None:
    """Raise ValueError unless ``matrix`` is a gpus_per_node-square, symmetric matrix of
    finite, non-negative GB/s with a zero diagonal and at least one link per GPU (unless the
    node has a ``host`` link for the GPUs without one)."""
    n = gpus_per_node
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise ValueError(f"peer_bandwidth_GBps must be {n} x {n} (gpus_per_node={n})")
    for i, row in enumerate(matrix):
        for j, value in enumerate(row):
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"peer_bandwidth_GBps[{i}][{j}]={value!r} must be a finite "
                                 "number >= 0 (GB/s)")
            if value != matrix[j][i]:
                raise ValueError(f"peer_bandwidth_GBps[{i}][{j}]={value} differs from "
                                 f"[{j}][{i}]={matrix[j][i]}: links carry both ways alike")
        if row[i] != 0:
            raise ValueError(f"peer_bandwidth_GBps[{i}][{i}]={row[i]} must be 0 (a GPU has "
                             "no link to itself)")
        if n > 1 and not host and not sum(row) > 0:
            raise ValueError(f"peer_bandwidth_GBps row {i} is all zero: GPU {i} would reach "
                             "no other GPU of its node")


def cut_node(group: NodeGroup, first: int, k: int) -> dict[str, Any]:
    """``NodeGroup`` fields of a switchless node cut to its GPUs [first, first + k) (the GPUs
    a plan uses): the direct links among them and the host link. A switched node, a cut past
    the matrix, or one leaving a GPU with no link and no host link to reach the others gets
    a switch (both None: the node's link stands in)."""
    matrix, none = group.peer_bandwidth_GBps, {"peer_bandwidth_GBps": None, "host_link": None}
    if matrix is None or first + k > len(matrix):
        return none
    rows = [row[first:first + k] for row in matrix[first:first + k]]
    if k > 1 and group.host_link is None and not all(sum(row) > 0 for row in rows):
        return none
    return {"peer_bandwidth_GBps": rows, "host_link": group.host_link}


def subset_ring_GBps(peer: np.ndarray, local: np.ndarray) -> float:
    """Ring bandwidth per GPU (one direction, the units of ``peer``) of a collective over the
    node GPUs ``local`` (indices into ``peer``): the least member's summed bandwidth to the
    other members (module docstring); inf for fewer than two members."""
    if local.size < 2:
        return math.inf
    return float(peer[np.ix_(local, local)].sum(axis=1).min())


def host_bandwidths(groups: Sequence[NodeGroup]) -> np.ndarray:
    """Per node group, its ``host_link``'s bandwidth after efficiency (GB/s, one direction),
    or its scale-up link's where it names none (inf for a one-GPU node without either)."""
    return np.array([g.host_link.bandwidth_GBps * g.host_link.efficiency if g.host_link
                     else g.intra_node_link.bandwidth_GBps * g.intra_node_link.efficiency
                     if g.intra_node_link else np.inf for g in groups])


def peer_matrices(groups: Sequence[NodeGroup]) -> list[np.ndarray | None]:
    """Per node group, its ``peer_bandwidth_GBps`` after the scale-up link's efficiency
    (GB/s, one direction), None for a switched node."""
    return [np.asarray(g.peer_bandwidth_GBps, dtype=float) * g.intra_node_link.efficiency
            if g.peer_bandwidth_GBps is not None and g.intra_node_link is not None else None
            for g in groups]


def mesh_capped(topology: Topology, arr: np.ndarray, nxt: np.ndarray,
                bw: np.ndarray) -> np.ndarray:
    """``bw`` (GB/s of the ring edges ``arr[i] -> nxt[i]``) with the edges inside a
    switchless node set to what the links between the group's members there carry
    (``subset_ring_GBps``, at most the node's scale-up link): NCCL's rings spread over all
    of them, not only the direct link between ring neighbours."""
    if not topology._switchless.any():
        return bw
    node = topology.node_of_gpu[arr]
    inside = node == topology.node_of_gpu[nxt]
    out = bw.copy()
    rates: dict[tuple[int, bytes], float] = {}
    for n in np.unique(node[inside]).tolist():
        g = int(topology.node_group[n])
        peer = topology._peer[g]
        if peer is None:
            continue
        local = arr[node == n] - topology._node_first[n]
        key = (g, local.tobytes())
        if key not in rates:
            # A member with no link to the others (DGX-1's SYS pairs, e.g. GPUs 3 and 4) has
            # no NVLink ring: the ring crosses the host (``NodeGroup.host_link``).
            rate = subset_ring_GBps(peer, local)
            rates[key] = (min(rate, float(topology._intra_bw[g])) if rate > 0
                          else float(topology._host_bw[g]))
        out[inside & (node == n)] = rates[key]
    return out


def mesh_pairs(topology: Topology, a: np.ndarray, b: np.ndarray, same_node: np.ndarray,
               bw: np.ndarray) -> np.ndarray:
    """``bw`` (GB/s of the sends ``a[i] -> b[i]``) with the sends between two GPUs of a
    switchless node at their direct links' bandwidth; a pair with no direct link (DGX-1's
    ``SYS`` pairs) crosses the host (``NodeGroup.host_link``; without one the node's link
    figure stands in, optimistic)."""
    if not topology._switchless.any():
        return bw
    out = bw.copy()
    group = topology.group_of_gpu[a]
    for g, peer in enumerate(topology._peer):
        sel = same_node & (group == g) & (a != b) if peer is not None else None
        if sel is None or not sel.any():
            continue
        first = topology._node_first[topology.node_of_gpu[a[sel]]]
        direct = peer[a[sel] - first, b[sel] - first]
        out[sel] = np.where(direct > 0, direct, topology._host_bw[g])
    return out
