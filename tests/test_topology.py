"""Topology: pair tiers and bandwidths, ring/hierarchical bottlenecks, graph consistency."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from paraplan import Topology, load_cluster
from paraplan.specs import SpecError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "validation"


def test_dgx_h100_pairs():
    topo = Topology(load_cluster("dgx-h100", nodes=4))
    same = topo.pair(0, 7)
    assert same.tier == "intra_node"
    nv = load_cluster("dgx-h100").node_groups[0].intra_node_link
    assert same.bandwidth_GBps == pytest.approx(nv.bandwidth_GBps * nv.efficiency)
    cross = topo.pair(0, 8)
    ib = load_cluster("dgx-h100").node_groups[0].inter_node_link
    assert cross.tier == "intra_region"
    # 8 NICs for 8 GPUs: each GPU's share is one full NDR port.
    assert cross.bandwidth_GBps == pytest.approx(50 * ib.efficiency)
    assert topo.pair(3, 3).tier == "self"


def test_shared_nic_divides_bandwidth():
    topo = Topology(load_cluster("aws-p3.16xlarge", nodes=2))
    shared = topo.pair(0, 8).bandwidth_GBps
    exclusive = topo.pair(0, 8, shared=False).bandwidth_GBps
    assert shared == pytest.approx(exclusive / 8)  # one 25 Gb/s NIC for 8 GPUs


def test_ring_over_tp_group_is_nvlink_and_dp_group_uses_nics():
    topo = Topology(load_cluster("dgx-a100-80gb", nodes=4))
    tp = topo.ring(range(8))
    assert tp.tier == "intra_node" and tp.num_nodes == 1 and tp.n == 8
    dp = topo.ring([0, 8, 16, 24])  # one GPU per node: each rank has one NIC
    ib = load_cluster("dgx-a100-80gb").node_groups[0].inter_node_link
    assert dp.tier == "intra_region"
    assert dp.bandwidth_GBps == pytest.approx(ib.bandwidth_GBps * ib.efficiency)
    # A ring over all 32 GPUs: 8 members per node drive 8 NICs, so the inter-node edges get
    # 8 NICs' worth (capped by NVLink on the intra edges).
    full = topo.ring(range(32))
    assert full.bandwidth_GBps == pytest.approx(
        min(8 * ib.bandwidth_GBps * ib.efficiency, tp.bandwidth_GBps))


def test_hierarchical_split():
    topo = Topology(load_cluster("dgx-h100", nodes=4))
    h = topo.hierarchical(range(32))
    assert h.gpus_per_node == 8 and h.num_nodes == 4
    assert h.intra is not None and h.intra.tier == "intra_node"
    assert h.inter is not None and h.inter.n == 4 and h.inter.tier == "intra_region"
    h1 = topo.hierarchical([0, 1, 2, 3])
    assert h1.inter is None and h1.num_nodes == 1


def test_dtfm_worldwide_pairs_equal_the_measured_csv():
    cluster = load_cluster("dtfm-worldwide")
    topo = Topology(cluster)
    region_of = {}
    gpu = 0
    for g in cluster.node_groups:
        for _ in range(g.num_gpus):
            region_of.setdefault(g.region, gpu)
            gpu += 1
    rows = list(csv.DictReader((SHARED / "aws_region_links.csv").open())) if SHARED.exists() \
        else []
    checked = 0
    for row in rows:
        if row["region_a"] in region_of and row["region_b"] in region_of:
            p = topo.pair(region_of[row["region_a"]], region_of[row["region_b"]])
            assert p.tier == "inter_region"
            assert p.bandwidth_GBps == pytest.approx(float(row["bandwidth_gbps"]) / 8)
            assert p.latency_s == pytest.approx(float(row["latency_ms"]) / 1e3)
            checked += 1
    assert checked == 28 or not rows
    same_region = topo.pair(0, 1)
    assert same_region.tier == "intra_region"
    assert same_region.bandwidth_GBps == pytest.approx(2 / 8)  # 2 Gb/s inside a region
    assert same_region.latency_s == pytest.approx(0.010)


def test_ring_order_matters_on_wan():
    topo = Topology(load_cluster("dtfm-worldwide"))
    # Regions are blocks of 8: 0 Oregon, 8 Virginia, 16 Ohio, 24 Tokyo, 32 Seoul, ...
    good = topo.ring([0, 8, 16, 24, 32])  # Oregon-Virginia-Ohio-Tokyo-Seoul-(back to Oregon)
    bad = topo.ring([0, 32, 8, 24, 16])
    assert good.latency_s < bad.latency_s


@pytest.mark.parametrize("name", ["dgx-h100", "aws-p3.16xlarge", "dtfm-spot", "dtfm-regional",
                                  "dtfm-worldwide", "pcie-rtx4090x8"])
def test_graph_bottleneck_equals_exclusive_pair_bandwidth(name):
    cluster = load_cluster(name) if name.startswith("dtfm") else load_cluster(name, nodes=3)
    topo = Topology(cluster)
    rng = np.random.default_rng(0)
    graph = topo.graph
    assert graph.number_of_nodes() < 4 * cluster.num_gpus + 2 * cluster.num_nodes + 20
    for a, b in rng.integers(0, cluster.num_gpus, size=(25, 2)):
        if a == b:
            continue
        assert topo.graph_path_bandwidth(int(a), int(b)) == pytest.approx(
            topo.pair(int(a), int(b), shared=False).bandwidth_GBps)


def test_16k_gpus_without_quadratic_structures():
    topo = Topology(load_cluster("dgx-h100", nodes=2048))
    assert topo.num_gpus == 16384
    dp_group = np.arange(0, 16384, 8)  # one rank per node
    ring = topo.ring(dp_group)
    assert ring.n == 2048 and ring.num_nodes == 2048
    h = topo.hierarchical(np.arange(16384))
    assert h.num_nodes == 2048 and h.gpus_per_node == 8


def test_group_errors():
    topo = Topology(load_cluster("dgx-h100"))
    with pytest.raises(SpecError, match="outside the cluster's range 0..7"):
        topo.ring([0, 8])
    with pytest.raises(SpecError, match="lists a GPU twice"):
        topo.ring([0, 0])


def test_hierarchical_intra_ring_is_the_slowest_node() -> None:
    """The vectorized per-node rings pick the same node as costing each node's ring."""
    from paraplan import load_cluster

    for name in ("dtfm-worldwide", "dtfm-multi-university", "dgx-h100"):
        cl = load_cluster(name) if name.startswith("dtfm") else load_cluster(name, nodes=4)
        topo = cl.topology
        rng = np.random.default_rng(0)
        for _ in range(20):
            group = tuple(rng.permutation(cl.num_gpus)[: rng.integers(2, cl.num_gpus)].tolist())
            hier = topo.hierarchical(group)
            arr = np.asarray(group)
            nodes = topo.node_of_gpu[arr]
            worst = None
            for node in np.unique(nodes):
                members = arr[nodes == node]
                if members.size > 1:
                    cost = topo.ring(tuple(members.tolist()))
                    if worst is None or cost.bandwidth_GBps < worst.bandwidth_GBps:
                        worst = cost
            assert hier.intra == worst
