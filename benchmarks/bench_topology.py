"""Topology scale benchmark: 16,384 GPUs (2,048 DGX H100 nodes).

Run: python benchmarks/bench_topology.py
Measures building the topology, pair lookups, rings over DP groups, a hierarchical split of the
whole cluster and building the explicit networkx graph. Budget: each under a few seconds on 2
cores (structures are linear in the GPU count).
"""

from __future__ import annotations

import time

import numpy as np

from paraplan import Topology, load_cluster


def timed(label: str, fn, repeat: int = 1):
    start = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    elapsed = (time.perf_counter() - start) / repeat
    print(f"{label:55s} {elapsed * 1e3:10.2f} ms")
    return out, elapsed


def main() -> None:
    cluster = load_cluster("dgx-h100", nodes=2048)
    topo, t_build = timed("build Topology (16,384 GPUs)", lambda: Topology(cluster))
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, topo.num_gpus, size=(1000, 2))
    _, t_pair = timed("1,000 pair() lookups", lambda: [topo.pair(int(a), int(b))
                                                       for a, b in pairs])
    _, t_ring = timed("ring over a 2,048-rank DP group", lambda: topo.ring(np.arange(0, 16384, 8)),
                      repeat=20)
    _, t_full = timed("ring over all 16,384 GPUs", lambda: topo.ring(np.arange(16384)), repeat=5)
    _, t_h = timed("hierarchical split of all 16,384 GPUs",
                   lambda: topo.hierarchical(np.arange(16384)))
    graph, t_g = timed("networkx graph (GPUs, switches, NICs, fabric)", lambda: topo.graph)
    print(f"graph: {graph.number_of_nodes():,} vertices, {graph.number_of_edges():,} edges")
    assert max(t_build, t_ring, t_full, t_h, t_g) < 10.0, "topology too slow at 16k GPUs"


if __name__ == "__main__":
    main()
