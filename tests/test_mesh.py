"""Switchless nodes (NodeGroup.peer_bandwidth_GBps): a ring collective over some of a node's
GPUs gets only the links between them (specs.mesh), checked by hand against the DGX-1 hybrid
cube mesh and AMD's xGMI full mesh."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from paraplan import ParallelPlan, TrainingSpec, load_cluster, load_model, simulate
from paraplan.simulator import collectives as coll
from paraplan.specs.loaders import cluster_from_dict
from paraplan.specs.mesh import subset_ring_GBps


@pytest.mark.parametrize("group,links", [((0, 1), 1), ((2, 3), 2), ((0, 1, 2, 3), 4),
                                         ((4, 5, 6, 7), 4), (tuple(range(8)), 6)])
def test_dgx1_rings_get_the_links_between_their_members(group, links):
    """nvidia-smi topo -m on a DGX-1: GPU0-1 share one NVLink, GPU2-3 two; in the quad
    GPU0-3 the least-linked member has four links to the others; all eight use six. Each
    link is 25 GB/s one way, at the nvlink2 profile's 0.78 efficiency."""
    topo = load_cluster("aws-p3.16xlarge").topology
    assert topo.ring(group).bandwidth_GBps == pytest.approx(links * 25 * 0.78)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_mi300x_groups_get_one_xgmi_link_per_peer(k):
    """A k-GPU group of MI300X's full mesh gets (k - 1) links of 64 GB/s at the xgmi3
    profile's 0.7: 44.8 GB/s on two GPUs (stas00's all_reduce_bench: 47.7 busbw) and 313.6
    on eight (measured 312.9)."""
    topo = load_cluster("mi300x-oam").topology
    assert topo.ring(tuple(range(k))).bandwidth_GBps == pytest.approx((k - 1) * 64 * 0.7)


def test_a_switched_node_gives_every_group_the_full_link():
    topo = load_cluster("dgx-h100").topology
    assert topo.ring((0, 1)).bandwidth_GBps == topo.ring(tuple(range(8))).bandwidth_GBps


def test_a_pairs_all_reduce_on_one_nvlink_by_hand():
    """Ring all-reduce of S bytes on two GPUs: 2 (n-1)/n S / B + 2 (n-1) alpha, with B one
    NVLink 2 link (25 GB/s x 0.78) and alpha 5 us."""
    topo = load_cluster("aws-p3.16xlarge").topology
    nbytes = 64e6
    expected = 2 * 0.5 * nbytes / (25 * 0.78 * 1e9) + 2 * 5e-6
    assert coll.group_collective(topo, (0, 1), "all_reduce", nbytes) == pytest.approx(expected)


def test_tensor_parallel_pairs_on_a_hybrid_cube_mesh_cost_more_than_on_a_switch():
    """tp=2 groups (0,1), (2,3), ... : the pair on one link paces the step; without the
    peer matrix the same node would give them all six links."""
    model = load_model("gpt3-xl")
    training = TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16")
    plan = ParallelPlan(tp=2, pp=1, dp=4, micro_batch_size=4, zero_stage=1)
    mesh = load_cluster("aws-p3.16xlarge")
    group = mesh.node_groups[0].model_copy(update={"peer_bandwidth_GBps": None})
    switch = mesh.model_copy(update={"node_groups": [group]})
    tp_mesh = simulate(model, mesh, training, plan).time_s["tp_comm"]
    tp_switch = simulate(model, switch, training, plan).time_s["tp_comm"]
    assert tp_switch > 0
    assert tp_mesh > 4 * tp_switch  # 6 links' bandwidth against 1 (latency is shared)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 16), k=st.integers(2, 16), v=st.floats(1.0, 1000.0))
def test_a_uniform_full_mesh_gives_k_members_k_minus_1_links(n, k, v):
    k = min(k, n)
    peer = np.full((n, n), v)
    np.fill_diagonal(peer, 0.0)
    rng = np.random.default_rng(n * 31 + k)
    local = np.sort(rng.choice(n, size=k, replace=False))
    assert subset_ring_GBps(peer, local) == pytest.approx((k - 1) * v)


def _cluster(matrix):
    return {"name": "mesh", "node": {"gpu": "v100-sxm2-16gb", "gpus_per_node": 2,
                                     "intra_node_link": "nvlink2", "inter_node_link": "eth-25g",
                                     "peer_bandwidth_GBps": matrix}}


@pytest.mark.parametrize("matrix,words", [
    ([[0, 25]], "2 x 2"),
    ([[0, 25], [50, 0]], "differs"),
    ([[5, 25], [25, 0]], "must be 0"),
    ([[0, -1], [-1, 0]], ">= 0"),
    ([[0, 0], [0, 0]], "all zero"),
    ([[0, float("nan")], [float("nan"), 0]], "finite"),
])
def test_bad_peer_matrices_are_refused_naming_the_field(matrix, words):
    with pytest.raises(Exception) as err:
        cluster_from_dict(_cluster(matrix))
    assert "peer_bandwidth_GBps" in str(err.value) and words in str(err.value)


def test_cli_refuses_a_bad_peer_matrix_in_one_line(tmp_path):
    bad = tmp_path / "mesh.yaml"
    bad.write_text("name: mesh\nnode:\n  gpu: v100-sxm2-16gb\n  gpus_per_node: 2\n"
                   "  intra_node_link: nvlink2\n  inter_node_link: eth-25g\n"
                   "  peer_bandwidth_GBps: [[0, 25], [50, 0]]\n")
    out = subprocess.run([sys.executable, "-m", "paraplan", "describe", "--cluster", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "peer_bandwidth_GBps" in out.stderr + out.stdout


def test_sends_between_two_gpus_use_their_direct_links():
    """Pipeline sends and other point-to-point traffic cross the pair's own links: one
    NVLink between GPU0 and GPU1 of a DGX-1, two between GPU2 and GPU3; a pair with no
    NVLink (GPU3-GPU4, ``SYS``) crosses the host's PCIe Gen3 x16 (``host_link``: 15.75 GB/s
    at the pcie3 profile's 0.83, GPUInspector's 13.0 GB/s V100 host copy)."""
    topo = load_cluster("aws-p3.16xlarge").topology
    assert topo.pair(0, 1).bandwidth_GBps == pytest.approx(25 * 0.78)
    assert topo.pair(2, 3).bandwidth_GBps == pytest.approx(50 * 0.78)
    assert topo.pair(3, 4).bandwidth_GBps == pytest.approx(15.75 * 0.83)
    assert topo.ring((3, 4)).bandwidth_GBps == pytest.approx(15.75 * 0.83)
    [(latency_s, bandwidth)] = topo.stage_boundaries(1, 2)  # stage 0 on GPU0 sends to GPU1
    assert bandwidth == pytest.approx(25 * 0.78) and latency_s == pytest.approx(5e-6)


def test_all_to_all_on_a_full_mesh_moves_each_share_over_its_own_link():
    """MI300X: each peer's share crosses its own 64 GB/s link at once, so four GPUs take as
    long as eight for the same share (the slowest link paces it), where a switch would
    serialize the shares through the GPU's one port. Over all eight both views agree."""
    topo = load_cluster("mi300x-oam").topology
    nbytes = 64e6
    link = 64 * 0.7 * 1e9
    four = coll.pairwise_all_to_all(topo, (0, 1, 2, 3), nbytes)
    eight = coll.pairwise_all_to_all(topo, tuple(range(8)), nbytes)
    assert four == pytest.approx(nbytes / 4 / link + 8e-6)
    assert eight == pytest.approx(nbytes / 8 / link + 8e-6)
    assert eight == pytest.approx(7 * nbytes / 8 / (448 * 0.7 * 1e9) + 8e-6)


def test_the_explicit_graph_carries_the_direct_links():
    topo = load_cluster("aws-p3.16xlarge").topology
    assert topo.graph_path_bandwidth(0, 1) == pytest.approx(topo.pair(0, 1, shared=False)
                                                            .bandwidth_GBps)
    assert topo.graph.has_edge("gpu:2", "gpu:3") and not topo.graph.has_edge("gpu:3", "gpu:4")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 15), min_size=2, max_size=16, unique=True))
@example([3, 4])
def test_any_group_of_a_hybrid_cube_mesh_gets_a_positive_finite_ring(group):
    """Placements (the evolutionary searcher's) can form groups whose members share no NVLink
    (GPUs 3 and 4 of a DGX-1): their rings cross the host, never at 0 or inf bandwidth, and a
    collective over them costs a finite time."""
    topo = load_cluster("aws-p3.16xlarge", nodes=2).topology
    ring = topo.ring(tuple(group))
    assert 0 < ring.bandwidth_GBps < float("inf")
    t = coll.group_collective(topo, tuple(group), "all_reduce", 1e6)
    assert 0 < t < float("inf")


def test_describe_shows_the_direct_links():
    out = subprocess.run([sys.executable, "-m", "paraplan", "describe", "--cluster",
                          "mi300x-oam", "--format", "json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0
    group = json.loads(out.stdout)["node_groups"][0]
    assert group["peer_bandwidth_GBps"][0] == [0, 64, 64, 64, 64, 64, 64, 64]


def test_expert_parallel_plans_on_a_full_mesh_agree_between_evaluator_and_simulate():
    """The vectorized search prices the all-to-all and the TP rings of a switchless node as
    simulate does: Mixtral 8x7B on two MI300X nodes, every plan with ep 2 or 4 (part of a
    node: one link per peer) and a sample of the rest."""
    from paraplan.search.space import SpaceOptions, build_space, evaluate_space

    model, cluster = load_model("mixtral-8x7b"), load_cluster("mi300x-oam", nodes=2)
    training = TrainingSpec(global_batch_size=64, seq_len=4096)
    space = build_space(model, cluster, training, options=SpaceOptions(max_micro_batch=2))
    ev = evaluate_space(space, times_for_oom=True, exact_interleaved=True)
    picks = [i for i in range(len(space)) if space.plan(i).ep in (2, 4)
             and not space.cols["uneven"][i]][::7][:12]
    assert picks
    for i in picks:
        rep = simulate(model, cluster, training, space.plan(i), time_if_oom=True)
        assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-6)
        assert ev.time["ep_comm"][i] == pytest.approx(rep.time_s["ep_comm"], rel=1e-6,
                                                      abs=1e-9 * rep.step_time_s)


def test_host_link_needs_a_switchless_node():
    data = _cluster([[0, 25], [25, 0]])
    data["node"]["host_link"] = "pcie3"
    assert cluster_from_dict(data).node_groups[0].host_link.name == "pcie3"
    del data["node"]["peer_bandwidth_GBps"]
    with pytest.raises(Exception, match="host_link"):
        cluster_from_dict(data)


def test_a_cut_node_keeps_its_links_and_host_path():
    """The ILP's partial nodes (``take_gpus``) keep the links among the GPUs they use; a cut
    leaving two GPUs with no NVLink between them (a DGX-1's GPUs 3 and 4) keeps the host link
    they reach each other through."""
    from paraplan.search.ilp.clusters import take_gpus
    from paraplan.specs.cluster import ClusterSpec

    cluster = load_cluster("aws-p3.16xlarge")
    (quad,) = take_gpus(cluster, "v100-sxm2-16gb", 0, 4)
    assert quad.peer_bandwidth_GBps == [[0, 25, 25, 50], [25, 0, 50, 25], [25, 50, 0, 50],
                                        [50, 25, 50, 0]]
    (pair,) = take_gpus(cluster, "v100-sxm2-16gb", 3, 2)
    assert pair.peer_bandwidth_GBps == [[0, 0], [0, 0]] and pair.host_link.name == "pcie3"
    cut = ClusterSpec(name="cut", node_groups=[pair])
    assert cut.topology.ring((0, 1)).bandwidth_GBps == pytest.approx(15.75 * 0.83)


def test_describe_table_marks_a_switchless_node():
    out = subprocess.run([sys.executable, "-m", "paraplan", "describe", "--cluster",
                          "aws-p3.16xlarge"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0
    assert "mesh 25/50 per pair, else pcie3" in out.stdout
