"""Relaxed synchronization knobs: wire-byte formulas by hand, DiLoCo on a WAN, the report's
savings section, and the vectorized search pricing them exactly as simulate does."""

from __future__ import annotations

import pytest

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan, simulate
from paraplan.search.space import build_space, evaluate_space, parse_fix
from paraplan.simulator.compression import NOT_MODELLED, dp_ratio, pp_ratio, savings
from paraplan.specs import SpecError

GPT_XL = load_model("gpt3-xl")
BF16 = TrainingSpec(global_batch_size=1024, seq_len=2048)  # bf16 gradients: 2 bytes


def test_quantize_topk_cocktail_by_hand() -> None:
    q = parse_plan("compress=quantize,bits=4")
    assert dp_ratio(GPT_XL, BF16, q) == pytest.approx(4 / 16)
    k = parse_plan("compress=topk,topk=0.01")
    assert dp_ratio(GPT_XL, BF16, k) == pytest.approx(0.01 * (2 + 4) / 2)
    c = parse_plan("compress=cocktail,topk=0.01,bits=4")
    assert dp_ratio(GPT_XL, BF16, c) == pytest.approx(0.01 * (0.5 + 4) / 2)
    fp32 = BF16.model_copy(update={"grad_reduce_fp32": True})
    assert dp_ratio(GPT_XL, fp32, q) == pytest.approx(4 / 32)


def test_powersgd_by_hand_on_one_matrix_model() -> None:
    """One layer, h=64, ffn=256, 1 head of 64, tied embeddings, vocab 64: every matrix by hand."""
    from paraplan import ModelSpec

    m = ModelSpec(name="tiny", num_layers=1, hidden_size=64, num_attention_heads=1,
                  ffn_hidden_size=256, vocab_size=64, tie_word_embeddings=True,
                  activation="gelu", norm="layernorm")
    r = 4
    mats = [(64, 192), (64, 64), (64, 256), (256, 64), (64, 64)]  # qkv, o, fc1, fc2, embedding
    dense = sum(a * b for a, b in mats)
    sent = sum(min(a * b, r * (a + b)) for a, b in mats)
    vectors = m.num_params - dense
    got = dp_ratio(m, BF16, parse_plan(f"compress=powersgd,rank={r}"))
    assert got == pytest.approx((sent + vectors) / (dense + vectors))
    # TP shards shrink each matrix, so the same rank compresses less.
    assert dp_ratio(m, BF16, parse_plan(f"tp=2,compress=powersgd,rank={r}")) > got


def test_diloco_h100_on_dtfm_worldwide_cuts_dp_time_100x() -> None:
    cluster = load_cluster("dtfm-worldwide")
    training = TrainingSpec(global_batch_size=1024, seq_len=2048, precision="fp16")
    base = simulate(GPT_XL, cluster, training, parse_plan("tp=1,pp=8,mbs=1,zero=1"))
    diloco = simulate(GPT_XL, cluster, training, parse_plan("tp=1,pp=8,mbs=1,zero=1,h=100"))
    assert base.feasible and diloco.feasible
    assert base.time_s["dp_comm"] / diloco.time_s["dp_comm"] == pytest.approx(100, rel=1e-9)
    s = diloco.extra["communication_savings"]
    assert s["dp_traffic_reduction"] == pytest.approx(100) and s["note"] == NOT_MODELLED
    # Pseudo-gradients at 4 bits on top: another 4x (fp16 gradients are 16 bits).
    q = simulate(GPT_XL, cluster, training, parse_plan("tp=1,pp=8,mbs=1,h=100,zero=1")
                 .model_copy(update={"pseudo_grad_bits": 4}))
    assert savings(GPT_XL, training, parse_plan("h=100").model_copy(
        update={"pseudo_grad_bits": 4}))["dp_traffic_reduction"] == pytest.approx(400)
    assert q.step_time_s < diloco.step_time_s


def test_aq_sgd_shrinks_pipeline_sends() -> None:
    cluster = load_cluster("dtfm-worldwide")
    training = TrainingSpec(global_batch_size=1024, seq_len=2048, precision="fp16")
    assert pp_ratio(training, parse_plan("aq_bits=4")) == pytest.approx(0.25)
    dense = simulate(GPT_XL, cluster, training, parse_plan("tp=1,pp=8,mbs=1,zero=1"))
    aq = simulate(GPT_XL, cluster, training, parse_plan("tp=1,pp=8,mbs=1,zero=1,aq_bits=4"))
    assert aq.extra["pp_p2p_s"] < dense.extra["pp_p2p_s"]
    assert aq.step_time_s < dense.step_time_s


@pytest.mark.parametrize("fix", ["compress=powersgd,rank=8", "compress=quantize,bits=8",
                                 "compress=cocktail,topk=0.05,bits=4,h=10", "aq_bits=8"])
def test_search_space_prices_knobs_like_simulate(fix: str) -> None:
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-a100-80gb", nodes=4)
    training = TrainingSpec(global_batch_size=256, seq_len=4096)
    space = build_space(model, cluster, training, fix=parse_fix(fix + ",tp=2"))
    ev = evaluate_space(space)
    checked = 0
    for i in range(0, len(space), max(1, len(space) // 25)):
        if ev.step_time_s[i] != ev.step_time_s[i]:  # NaN: infeasible
            continue
        rep = simulate(model, cluster, training, space.plan(i))
        assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-9)
        checked += 1
    assert checked > 5


def test_missing_knob_parameter_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="compression_rank"):
        parse_plan("compress=powersgd")
    with pytest.raises(SpecError, match="dp_sync_interval"):
        parse_plan({"pseudo_grad_bits": 4})


def test_relaxed_search_ranks_every_knob_setting_together() -> None:
    from paraplan.search.relaxed import RELAXED_GRID, relaxed_search

    model, cluster = GPT_XL, load_cluster("aws-p3.2xlarge", nodes=32)  # 1 V100/node, 10 Gbps
    training = TrainingSpec(global_batch_size=256, seq_len=2048, precision="fp16")
    result = relaxed_search(model, cluster, training, top=5)
    rows = result.extra["relaxed"]
    assert [r["knobs"] for r in rows] == list(RELAXED_GRID)
    dense = rows[0]
    assert dense["label"] == "dense, every step" and dense["speedup_vs_dense"] == 1.0
    # On 10 Gbps, synchronising 100x less often pays off (in bytes; convergence not modelled).
    diloco = next(r for r in rows if r["knobs"] == {"dp_sync_interval": 100})
    assert diloco["speedup_vs_dense"] > 1.5
    steps = [rep.step_time_s for rep in result.reports]
    assert steps == sorted(steps) and steps[0] == min(r["best_step_time_s"] for r in rows)
    assert "not modelled" in result.notes[0]
    # A pinned knob removes the grid points that contradict it.
    pinned = relaxed_search(model, cluster, training, top=2, fix={"dp_sync_interval": 10})
    assert all(r["knobs"].get("dp_sync_interval", 10) == 10 for r in pinned.extra["relaxed"])


def _two_region_cluster():
    from paraplan.specs.loaders import cluster_from_dict

    return cluster_from_dict({
        "name": "two-regions",
        "node_groups": [
            {"name": "a", "gpu": "v100-sxm2-16gb", "gpus_per_node": 1, "num_nodes": 3,
             "inter_node_link": "eth-10g", "region": "A"},
            {"name": "b", "gpu": "v100-sxm2-16gb", "gpus_per_node": 1, "num_nodes": 2,
             "inter_node_link": "eth-10g", "region": "B"}],
        "region_links": [{"a": "A", "b": "B", "latency_ms": 80, "bandwidth_Gbps": 0.5}]})


def test_sharded_ps_and_ps_by_hand() -> None:
    from paraplan.simulator import collectives as coll

    topo = _two_region_cluster().topology
    group, size, n = (0, 1, 2, 3, 4), 1e8, 5
    pairs = {(i, j): topo.pair(i, j) for i in group for j in group if i != j}
    want = 2 * max(c.latency_s + size / n / (c.bandwidth_GBps * 1e9) for c in pairs.values())
    assert coll.sharded_ps_all_reduce(topo, group, size) == pytest.approx(want)
    ps = 2 * min(max(pairs[s, j].latency_s for j in group if j != s)
                 + sum(size / (pairs[s, j].bandwidth_GBps * 1e9) for j in group if j != s)
                 for s in group)
    assert coll.ps_all_reduce(topo, group, size) == pytest.approx(ps)
    assert coll.sharded_ps_all_reduce(topo, (0,), size) == 0.0


def test_sharded_ps_beats_the_ring_on_a_wan() -> None:
    cluster = load_cluster("dtfm-worldwide")
    training = TrainingSpec(global_batch_size=1024, seq_len=2048, precision="fp16")
    ring = simulate(GPT_XL, cluster, training, parse_plan("tp=1,pp=8,mbs=1,zero=1"))
    sps = simulate(GPT_XL, cluster, training,
                   parse_plan("tp=1,pp=8,mbs=1,zero=1,dp_algo=sharded_ps"))
    assert sps.time_s["dp_comm"] < ring.time_s["dp_comm"] / 3
    assert sps.extra["plan_short"].endswith("sharded_ps")
