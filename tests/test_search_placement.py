"""Topology-aware placement: ``ParallelPlan.placement`` in simulate and the evolutionary
searcher behind ``search()``."""

from __future__ import annotations

import pytest

from paraplan import ParallelPlan, TrainingSpec, load_cluster, load_model, simulate
from paraplan.search import search
from paraplan.search.evolutionary import evolutionary_search, uniform_view
from paraplan.specs.checks import check_plan
from paraplan.specs.loaders import cluster_from_dict

FP16 = {"precision": "fp16"}


@pytest.fixture(scope="module")
def xl() -> tuple:
    return load_model("gpt3-xl"), TrainingSpec(global_batch_size=1024, seq_len=2048, **FP16)


def test_identity_placement_prices_like_rank_order_on_a_uniform_cluster():
    model = load_model("gpt3-2.7b")
    cluster = load_cluster("dgx-a100-80gb", nodes=4)
    training = TrainingSpec(global_batch_size=256, seq_len=2048)
    plan = ParallelPlan(tp=2, pp=4, micro_batch_size=2, sequence_parallel=True)
    a = simulate(model, cluster, training, plan)
    b = simulate(model, cluster, training, plan.model_copy(update={"placement":
                                                                   list(range(32))}))
    assert a.feasible and b.feasible
    # Same p2p link, same compute; the DP sync now takes the slowest stage (first/last hold
    # the embedding and LM head), which stage-by-stage can only be slower or equal.
    assert b.extra["pp_p2p_s"] == a.extra["pp_p2p_s"]
    assert b.time_s["compute"] == a.time_s["compute"]
    assert a.step_time_s <= b.step_time_s <= a.step_time_s * 1.01


def test_placement_that_keeps_data_parallel_groups_in_a_region_is_faster(xl):
    model, training = xl
    cluster = load_cluster("dtfm-regional")  # 4 regions x 16 GPUs, GPU index region-major
    plan = ParallelPlan(pp=4, dp=16, micro_batch_size=4, zero_stage=2)
    # Rank order puts stage k on region k: every DP group inside one region.
    regional = simulate(model, cluster, training, plan.model_copy(
        update={"placement": list(range(64))}))
    # Transposed: stage k takes the k-th GPU of every block of 4, so DP crosses regions.
    scattered = [4 * i + k for k in range(4) for i in range(16)]
    spread = simulate(model, cluster, training, plan.model_copy(
        update={"placement": scattered}))
    assert regional.feasible and spread.feasible
    # (A ring pays each WAN hop's latency once per pass: 4 of the 16 hops cross regions.)
    assert regional.time_s["dp_comm"] * 1.5 < spread.time_s["dp_comm"]
    # ... while its pipeline boundaries stay inside a region, so its p2p is cheaper.
    assert spread.extra["pp_p2p_s"] < regional.extra["pp_p2p_s"]


def test_bad_placements_are_rejected_with_reasons():
    model = load_model("gpt3-2.7b")
    cluster = load_cluster("dgx-a100-80gb", nodes=2)
    training = TrainingSpec(global_batch_size=64, seq_len=2048)
    with pytest.raises(ValueError, match="GPU twice"):
        ParallelPlan(tp=2, placement=[0, 0, 1])
    short = ParallelPlan(tp=2, placement=list(range(8)))
    assert any("exactly once" in r for r in check_plan(model, cluster, training, short))
    swap = list(range(16))
    swap[1], swap[8] = 8, 1  # ranks 0 and 1 (one TP group) on two nodes
    cross = ParallelPlan(tp=2, placement=swap)
    assert any("different nodes" in r for r in check_plan(model, cluster, training, cross))
    assert not simulate(model, cluster, training, cross).feasible


def test_uniform_view_is_one_group_of_the_smallest_gpu():
    mixed = cluster_from_dict({"name": "two-types", "node_groups": [
        {"gpu": "a100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 2,
         "intra_node_link": "nvlink3", "inter_node_link": "ib-hdr"},
        {"gpu": "v100-sxm2-32gb", "gpus_per_node": 8, "num_nodes": 2,
         "intra_node_link": "nvlink2", "inter_node_link": "eth-100g"}]})
    view = uniform_view(mixed)
    assert view.is_homogeneous and view.num_gpus == 32
    assert view.gpu.name == "v100-sxm2-32gb"
    homo = load_cluster("dgx-h100", nodes=2)
    assert uniform_view(homo) is homo


def test_evolutionary_search_beats_rank_order_on_dtfm_worldwide(xl):
    model, training = xl
    cluster = load_cluster("dtfm-worldwide")
    res = evolutionary_search(model, cluster, training, top=3, seed=1, shortlist=4, placed=1,
                              generations=8)
    again = evolutionary_search(model, cluster, training, top=3, seed=1, shortlist=4,
                                placed=1, generations=8)
    assert res.searcher == "evolutionary"
    best = res.best
    assert best.plan["placement"] is not None and "placed" in best.extra["plan_short"]
    assert best.step_time_s < res.baseline_step_time_s
    # The report is simulate's own for the placed plan.
    assert simulate(model, cluster, training, ParallelPlan(**best.plan)).step_time_s \
        == pytest.approx(best.step_time_s, rel=1e-12)
    row = res.extra["placements"][0]
    assert row["placement_comm_cost_s"] < row["rank_order_comm_cost_s"]
    conv = row["convergence_s"]
    assert all(b <= a for a, b in zip(conv, conv[1:], strict=False))
    assert [r.step_time_s for r in again.reports] == [r.step_time_s for r in res.reports]
    assert again.best.plan["placement"] == best.plan["placement"]


def test_auto_picks_a_searcher_by_cluster_kind(xl):
    model, training = xl
    assert search(model, load_cluster("dtfm-multi-university"), training, top=1,
                  searcher="auto").searcher == "evolutionary"
    homo = search(load_model("gpt3-350m"), load_cluster("dgx-a100-80gb", nodes=1),
                  TrainingSpec(global_batch_size=64, seq_len=2048), top=1)
    assert homo.searcher == "exhaustive"


def test_mixed_cluster_prices_each_stage_tp_on_its_own_links():
    """Stage 1 on RTX 4090s (PCIe) pays PCIe TP all-reduces even when stage 0 sits on
    NVLink A100s: it matches the same stage on an all-4090 cluster."""
    a100 = {"gpu": "a100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 1,
            "intra_node_link": "nvlink3", "inter_node_link": "eth-100g"}
    rtx = {"gpu": "rtx4090", "gpus_per_node": 8, "num_nodes": 1,
           "intra_node_link": "pcie4", "inter_node_link": "eth-100g"}
    mixed = cluster_from_dict({"name": "a100-then-4090", "node_groups": [a100, rtx]})
    only = cluster_from_dict({"name": "4090s", "node_groups": [{**rtx, "num_nodes": 2}]})
    model = load_model("gpt3-760m")
    training = TrainingSpec(global_batch_size=64, seq_len=1024, **FP16)
    plan = ParallelPlan(tp=2, pp=2, micro_batch_size=1, zero_stage=1, recompute="full")
    a = simulate(model, mixed, training, plan)
    b = simulate(model, only, training, plan)
    assert a.extra["stage_gpu_types"] == [["a100-sxm-80gb"], ["rtx4090"]]
    assert a.extra["stage_forward_s"][1] == pytest.approx(b.extra["stage_forward_s"][1],
                                                          rel=1e-12)
    assert a.extra["stage_forward_s"][0] < b.extra["stage_forward_s"][0]
