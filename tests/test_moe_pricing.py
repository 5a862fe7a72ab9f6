"""MoE pricing against hand-worked and published numbers: which tokens a rank routes under
TP, the all-to-all over a rail-optimised fabric, the node-deduplicated dispatcher, group-
limited routing, all-to-all overlap, routing imbalance and fp8 activation memory."""

from __future__ import annotations

from math import comb

import pytest

from paraplan.simulator import collectives as coll
from paraplan.simulator import moe
from paraplan.simulator.compute import Device
from paraplan.simulator.elementwise import ACTIVATION_KERNEL_COST, elementwise_bytes_per_token
from paraplan.simulator.layer import compose_layer_cost, layer_parts
from paraplan.simulator.layer_compose import OVERLAPPED_A2A_STRETCH
from paraplan.simulator.memory import layer_activation_bytes
from paraplan.specs.loaders import load_cluster, load_model, load_trainer
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import trainer_reasons
from paraplan.specs.training import TrainingSpec

# Megatron Core MoE report (arXiv 2603.07685) Table 7: DeepSeek-V3 shapes (hidden 7168,
# 4096 tokens per rank, 256 experts, top-8, bf16), H100 DGX nodes, one all-to-all, seconds.
NCCL_EP64_DISPATCH_S = 9164e-6
NCCL_EP16_COMBINE_S = 5774e-6
HYBRIDEP_EP64_DISPATCH_S = 4626e-6
HYBRIDEP_EP16_COMBINE_S = 1485e-6


def _dsv3_copies_bytes() -> float:
    return 4096 * 8 * 7168 * 2.0  # T k h, bf16


def test_dispatch_tokens_are_the_sequence_parallel_shard() -> None:
    model = load_model("qwen3-235b-a22b")
    training = TrainingSpec(global_batch_size=64, seq_len=4096, moe_load_imbalance=1.0)
    one = ParallelPlan(tp=1, ep=32, etp=1)
    two = ParallelPlan(tp=2, ep=32, etp=1, sequence_parallel=True)
    assert moe.dispatch_tokens(training, one) == 4096
    assert moe.dispatch_tokens(training, two) == 2048  # [s/tp, b, h] enters the MoE layer
    # 32 ranks x 2048 tokens x 8 copies over 128 experts.
    assert moe.expert_rows(model, training, two) == 32 * 2048 * 8 / 128
    # Expert TP = TP: the ETP group gathers its members' tokens back to s per expert row set.
    folded = ParallelPlan(tp=2, ep=32, sequence_parallel=True)  # etp defaults to tp
    assert moe.expert_rows(model, training, folded) == 2 * 32 * 2048 * 8 / 128
    assert moe.dispatch_bytes(model, training, two) == 2048 * 8 * 4096 * 2


@pytest.mark.parametrize(("nodes", "kind", "published"), [
    (8, "dispatch", NCCL_EP64_DISPATCH_S), (2, "combine", NCCL_EP16_COMBINE_S)])
def test_nccl_all_to_all_across_nodes_matches_table_7(nodes: int, kind: str,
                                                      published: float) -> None:
    cluster = load_cluster("dgx-h100", nodes)
    group = tuple(range(8 * nodes))
    t = coll.group_collective(cluster.topology, group, "all_to_all", _dsv3_copies_bytes())
    # Hand-worked: the (n - 8)/n cross-node share leaves through the GPU's own 400 Gb/s NIC
    # at the link's 0.9 efficiency, plus one IB latency.
    n = 8 * nodes
    assert t == pytest.approx((n - 8) / n * _dsv3_copies_bytes() / 45e9 + 20e-6, rel=1e-9)
    assert t == pytest.approx(published, rel=0.12)


def test_ring_pooling_of_nics_does_not_apply_to_all_to_all() -> None:
    """A ring collective pools the node's NICs; an all-to-all cannot."""
    topo = load_cluster("dgx-h100", 4).topology
    group = tuple(range(32))
    a2a = coll.group_collective(topo, group, "all_to_all", 1e9)
    gather = coll.group_collective(topo, group, "all_gather", 1e9)
    assert a2a > 2 * gather


@pytest.mark.parametrize(("nodes", "published"), [
    (8, HYBRIDEP_EP64_DISPATCH_S), (2, HYBRIDEP_EP16_COMBINE_S)])
def test_hierarchical_dispatch_matches_table_7(nodes: int, published: float) -> None:
    model = load_model("deepseek-v3")
    topo = load_cluster("dgx-h100", nodes).topology
    token = 4096 * 7168 * 2.0
    remote = token * moe.other_groups_hit(model, nodes)
    local = token * moe.other_groups_hit(model, 8 * nodes)  # one copy per other rank hit
    t = coll.forwarded_all_to_all(topo, tuple(range(8 * nodes)), remote, local)
    # HybridEP's extra device-to-device copy (10-20% of its time, Megatron-LM DeepSeek-V3
    # GB200 notes) is not priced: paraplan stays within 20% below the measurement.
    assert 0.8 * published < t <= published


def test_remote_nodes_by_hand() -> None:
    model = load_model("deepseek-v3")  # 256 experts, top-8, 8 groups, 4 per token
    plain = model.model_copy(update={"moe_router_groups": None, "moe_router_group_topk": None})
    assert moe.other_groups_hit(plain, 1) == 0.0
    assert moe.other_groups_hit(plain, 4) == pytest.approx(
        3 * (1 - comb(192, 8) / comb(256, 8)))
    # One group per node (8 nodes): a node is hit when its group is among the 4 and one of
    # the 8 experts drawn from the 4 x 32 lands in it; at most 4 nodes in all.
    grouped = moe.other_groups_hit(model, 8)
    assert grouped == pytest.approx(7 * 4 / 8 * (1 - comb(96, 8) / comb(128, 8)))
    assert grouped < 4 < moe.other_groups_hit(plain, 8)


def _parts(training: TrainingSpec, plan: ParallelPlan, nodes: int = 4):
    model = load_model("deepseek-v3")
    cluster = load_cluster("dgx-h100", nodes)
    device = Device.of_training(cluster.gpu, training)
    return layer_parts(model, cluster.topology, training, plan, device, moe=True)


def test_hierarchical_dispatcher_is_cheaper_across_nodes() -> None:
    plan = ParallelPlan(tp=1, ep=32, etp=1)
    base = TrainingSpec(global_batch_size=64, seq_len=4096, moe_load_imbalance=1.0)
    nccl = _parts(base, plan).ep_s
    dedup = _parts(base.model_copy(update={"moe_dispatcher": "hierarchical"}), plan).ep_s
    assert dedup < 0.5 * nccl


def test_a2a_overlap_hides_what_compute_covers() -> None:
    plan = ParallelPlan(tp=1, ep=32, etp=1)
    base = TrainingSpec(global_batch_size=64, seq_len=4096, moe_load_imbalance=1.0)
    parts = _parts(base.model_copy(update={"moe_a2a_overlap": True}), plan)
    exposed = compose_layer_cost(parts, "none")
    lt = parts.times
    # Four all-to-alls of ep_s / 2 each, each beside one piece of the merged pair's compute
    # (Megatron-Core TransformerLayerSchedulePlan.run): combine bwd | attention-side forward
    # (after the attention-side wgrad), dispatch fwd | expert dgrad, dispatch bwd | expert
    # wgrad + forward, combine fwd | attention-side dgrad.
    e, a2a, slow = lt.expert_fwd_s, parts.ep_s / 2, parts.ep_overlap_slowdown
    assert 0 < e < lt.gemm_fwd_s
    side_w = lt.gemm_fwd_s - e
    pieces = [side_w + lt.forward_s - e, e, 2 * e, lt.backward_s - 2 * e - side_w]
    assert sum(pieces) == pytest.approx(lt.forward_s + lt.backward_s)
    # With the overlap on, each all-to-all runs OVERLAPPED_A2A_STRETCH (k) times as long.
    k = OVERLAPPED_A2A_STRETCH
    assert k == pytest.approx(1.312, abs=5e-4)  # 10.83 s / 8.25 s of kernel time (Nsight A/B)
    expected = sum(max(0.0, k * a2a - x) + min(k * a2a, x) * slow for x in pieces)
    assert exposed.ep == pytest.approx(expected)
    # Warm-up forwards, with no partner, run their (stretched) all-to-alls exposed: never
    # cheaper than a partnered forward's share.
    assert exposed.ep_lone_fwd >= 0 and exposed.ep_lone_bwd >= 0
    assert exposed.ep < compose_layer_cost(_parts(base, plan), "none").ep
    # Pooling all the compute against all the communication would hide more: an all-to-all
    # longer than its own piece stays partly exposed even when the layer's compute is longer.
    comm, cover = 2 * parts.ep_s, lt.forward_s + lt.backward_s
    assert exposed.ep >= max(0.0, comm - cover) + min(comm, cover) * slow
    # Megatron refuses the overlap under full recomputation: priced exposed there.
    assert compose_layer_cost(parts, "full").ep == pytest.approx(3 * parts.ep_s)


def test_imbalance_scales_the_busiest_rank() -> None:
    plan = ParallelPlan(tp=1, ep=32, etp=1)
    even = TrainingSpec(global_batch_size=64, seq_len=4096, moe_load_imbalance=1.0)
    skew = even.model_copy(update={"moe_load_imbalance": 1.5})
    model = load_model("deepseek-v3")
    assert moe.expert_rows(model, skew, plan) == 1.5 * moe.expert_rows(model, even, plan)
    assert _parts(skew, plan).times.gemm_fwd_s > _parts(even, plan).times.gemm_fwd_s
    # A capacity factor caps the load at c times the mean, imbalance or not.
    capped = plan.model_copy(update={"moe_capacity_factor": 1.0})
    assert moe.expert_rows(model, skew, capped) == moe.expert_rows(model, even, plan)
    assert TrainingSpec(global_batch_size=1, seq_len=8).moe_load_imbalance == 1.3
    # The busiest rank's expert activation (SwiGLU on its rows) scales with the load; the
    # permute of the rank's own tokens and the rest of the layer do not.
    fused = dict(moe=True)
    # 16-bit bytes, at the gated activation kernel's measured cost (copy-equivalent bytes)
    gated = 6.0 * ACTIVATION_KERNEL_COST["gated"] * model.expert_ffn \
        * moe.routed_copies_per_token(model, plan)
    diff = elementwise_bytes_per_token(model, skew, plan, **fused) \
        - elementwise_bytes_per_token(model, even, plan, **fused)
    assert diff == pytest.approx(0.5 * gated)


def test_fp8_keeps_linear_inputs_in_one_byte() -> None:
    model = load_model("llama3-8b")
    plan = ParallelPlan(tp=1)
    bf16 = TrainingSpec(global_batch_size=8, seq_len=4096, precision="bf16")
    fp8 = bf16.model_copy(update={"precision": "fp8"})
    h, f, s = 4096, 14336, 4096
    saved = layer_activation_bytes(model, bf16, plan, 1, moe=False) - \
        layer_activation_bytes(model, fp8, plan, 1, moe=False)
    # QKV and MLP inputs (1 B each of 2) and the down projection's input (1 B of 2 per ffn
    # element) are halved; the attention output is kept again in fp8 for the projection.
    assert saved == pytest.approx(s * (h + h + f - h))


def test_trainer_refuses_what_it_cannot_run() -> None:
    model = load_model("deepseek-v3")
    training = TrainingSpec(global_batch_size=64, seq_len=4096, moe_dispatcher="hierarchical",
                            moe_a2a_overlap=True)
    plan = ParallelPlan(tp=1, pp=4, ep=8, etp=1, recompute="full")
    megatron = trainer_reasons(load_trainer("megatron-core"), model, training, plan)
    assert any("full recomputation" in r for r in megatron)
    assert any("interleaved" in r for r in megatron)
    titan = trainer_reasons(load_trainer("torchtitan"), model, training, plan)
    assert any("hierarchical MoE token dispatcher" in r for r in titan)


def test_gb200_rows_run_in_64_gpu_nvlink_domains() -> None:
    from paraplan.validate.published import load_published_throughput

    rows = [c for c in load_published_throughput()
            if c.source_id == "megatron_bridge_moe" and c.cluster is not None
            and c.cluster.gpu.name == "gb200"]
    assert len(rows) == 4
    for case in rows:
        group = case.cluster.node_groups[0]
        assert group.gpus_per_node == min(64, case.num_gpus)
        if group.num_nodes > 1:
            assert group.nics_per_node == group.gpus_per_node  # one ConnectX-7 per GPU
        assert case.cluster.num_gpus == case.num_gpus
        assert case.training.moe_load_imbalance == 1.0  # forced balance, as NVIDIA runs them


# Megatron-LM's own per-layer MoE benchmark (tests/functional_tests/test_cases/common/moe_perf:
# test_cases.py and baseline.json @d98e8a64dd): one MoE layer on 8 H100 of a node, EP8,
# 4096 tokens per rank, bf16, forced balance, fused permute and router; milliseconds.
MOE_PERF_H100 = {  # (proxy, dispatcher): (forward ms, backward ms)
    ("mixtral", "alltoall"): (4.327, 7.684),
    ("deepseek", "alltoall"): (7.119, 10.483),
    ("deepseek", "hierarchical"): (5.391, 8.795),  # HybridEP
}


def _moe_perf_proxy(name: str):
    from paraplan.specs.model import ModelSpec

    if name == "mixtral":
        return ModelSpec(name="mixtral-proxy", num_layers=1, hidden_size=4096,
                         num_attention_heads=8, ffn_hidden_size=14336, vocab_size=32000,
                         num_experts=8, moe_top_k=2)
    return ModelSpec(name="deepseek-proxy", num_layers=1, hidden_size=7168,
                     num_attention_heads=8, ffn_hidden_size=2048, vocab_size=32000,
                     num_experts=32, moe_top_k=8, moe_ffn_hidden_size=2048,
                     num_shared_experts=1, moe_router_groups=8, moe_router_group_topk=4)


@pytest.mark.parametrize(("proxy", "dispatcher"), sorted(MOE_PERF_H100))
def test_one_moe_layer_matches_megatron_moe_perf(proxy: str, dispatcher: str) -> None:
    """The MoE block alone (GEMMs, its memory-bound routing and activation, the two
    all-to-alls) against Megatron's measured layer. The harness hides the router's launch
    overhead behind a dummy GEMM, so this is mostly GPU time; paraplan is 2-24% too fast on
    it (README, "MoE runs"): held within 30%, and never slower than measured."""
    from paraplan.simulator.compute import dispatch_sort_time
    from paraplan.simulator.elementwise import elementwise_bytes_per_token
    from paraplan.simulator.layer_terms import mlp_gemm_time

    model = _moe_perf_proxy(proxy)
    cluster = load_cluster("dgx-h100", 1)
    training = TrainingSpec(global_batch_size=8, seq_len=4096, moe_load_imbalance=1.0,
                            moe_dispatcher=dispatcher)
    plan = ParallelPlan(tp=1, ep=8, etp=1)
    device = Device.of_training(cluster.gpu, training)
    gemm = mlp_gemm_time(model, training, plan, device, moe=True)
    # The MoE block's own memory traffic: the layer's minus the attention half's (norms,
    # residual adds and rotary are counted the same on a dense layer without its MLP act).
    dense_only = elementwise_bytes_per_token(
        model.model_copy(update={"num_experts": 0, "moe_top_k": 0, "num_shared_experts": 0,
                                 "moe_router_groups": None, "moe_router_group_topk": None,
                                 "ffn_hidden_size": 1}), training, plan, moe=False)
    moe_bytes = elementwise_bytes_per_token(model, training, plan, moe=True) - dense_only
    # ... and the all-to-all dispatcher's sort by local expert (DeepSeek proxy: 4 per rank).
    elementwise = 4096 * moe_bytes / device.memory_Bps + dispatch_sort_time(
        model, training, plan, device)
    a2a = layer_parts(model, cluster.topology, training, plan, device, moe=True).ep_s
    sort = dispatch_sort_time(model, training, plan, device)  # copied once each way
    fwd, bwd = gemm + elementwise + a2a, 2 * gemm + 2 * elementwise - sort + a2a
    want_fwd, want_bwd = MOE_PERF_H100[(proxy, dispatcher)]
    assert 0.7 * want_fwd <= fwd * 1e3 <= want_fwd
    assert 0.7 * want_bwd <= bwd * 1e3 <= want_bwd


@pytest.mark.parametrize(("ep", "published"), [(8, 735e-6), (64, 930e-6)])
def test_nvl72_all_to_all_matches_table_7(ep: int, published: float) -> None:
    """NCCL all-to-all inside one GB200 NVL72 rack (the report's Table 7, DeepSeek-V3 shapes):
    the rack profile's measured all-to-all efficiency puts both sizes within 10%."""
    topo = load_cluster("gb200-nvl72", 1).topology
    t = coll.group_collective(topo, tuple(range(ep)), "all_to_all", _dsv3_copies_bytes())
    assert t == pytest.approx(published, rel=0.10)


def test_a2a_overlap_warm_up_and_cool_down_run_alone() -> None:
    """Without pipelining Megatron-Core runs micro-batch 0's forward and the last backward
    with no partner (combined_1f1b.py): of m passes, one forward and one backward expose
    their all-to-alls in full; interleaved, the warm-up count does (schedules.py)."""
    from paraplan.simulator.layer import layer_cost, unpartnered_share
    from paraplan.simulator.step import simulate

    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100", 4)
    training = TrainingSpec(global_batch_size=64, seq_len=4096, moe_load_imbalance=1.0,
                            moe_a2a_overlap=True)
    plan = ParallelPlan(tp=1, pp=1, ep=8, etp=1, zero_stage=1, micro_batch_size=1)
    m = 64 // 32
    device = Device.of_training(cluster.gpu, training)
    cost = layer_cost(model, cluster.topology, training, plan, device, moe=True)
    plain = layer_cost(model, cluster.topology, training.model_copy(
        update={"moe_a2a_overlap": False}), plan, device, moe=True)
    # A lone pass exposes what the plain schedule does, at the overlapped run's kernel speed.
    k = OVERLAPPED_A2A_STRETCH
    assert cost.ep / 2 + cost.ep_lone_fwd == pytest.approx(k * plain.ep / 2)
    assert cost.ep / 2 + cost.ep_lone_bwd == pytest.approx(k * plain.ep / 2)
    assert unpartnered_share("1f1b", 1, m, 0, 1) == 1 / m
    rep = simulate(model, cluster, training, plan, time_if_oom=True)
    want = model.num_layers * (m * cost.ep + cost.ep_lone_fwd + cost.ep_lone_bwd)
    assert rep.time_s["ep_comm"] == pytest.approx(want)
    # Interleaved p = 4, v = 2, m = 8, stage 0: 2*3 + 1*4 + 1 = 11 of 16 chunk-forwards warm up.
    assert unpartnered_share("interleaved", 4, 8, 0, 2) == pytest.approx(11 / 16)
    assert unpartnered_share("interleaved", 4, 8, 3, 2) == pytest.approx(5 / 16)


def test_current_scaled_fp8_casts_launch_their_own_kernels_per_expert() -> None:
    """Transformer Engine's current scaling zeroes, reduces and turns the amax into a scale in
    three kernels of its own per cast, and grouped experts cast expert by expert: each of a
    local expert's two GEMMs casts its input in the forward and grad_output in the backward
    (weights cached across micro-batches), 2 x 3 launches over the three passes, of which the
    forward GEMM time carries a third (layer_times doubles it for the backward)."""
    from paraplan.simulator.compute import KERNEL_OVERHEAD_S
    from paraplan.simulator.layer_terms import expert_gemm_time

    model = load_model("qwen3-30b-a3b")
    gpu = load_cluster("dgx-h100").gpu
    plan = ParallelPlan(ep=16)
    base = TrainingSpec(global_batch_size=1024, seq_len=4096, precision="fp8",
                        fp8_weight_cache=True, fp8_scaling="current")
    te = base.model_copy(update={"fp8_cast_kernels": 3})
    assert load_trainer("megatron-core").runs.fp8_cast_kernels == 3

    def experts(tr: TrainingSpec) -> float:
        return expert_gemm_time(model, tr, plan, Device.of_training(gpu, tr))

    local = model.num_experts // plan.ep
    per_gemm = 2 * 3 * KERNEL_OVERHEAD_S / 3
    assert experts(te) - experts(base) == pytest.approx(local * 2 * per_gemm)
    delayed = te.model_copy(update={"fp8_scaling": "delayed"})
    assert experts(delayed) == experts(delayed.model_copy(update={"fp8_cast_kernels": 0}))


def test_gpt_oss_clamped_glu_and_expert_biases_move_their_own_bytes() -> None:
    """gpt-oss under Megatron: per routed row (on the busiest rank), the clamps and
    re-concatenation of the GLU halves (16 B per expert-width element) and the expert-by-expert
    fc2 bias add (12 B per hidden element); eager stacks 20 and 8. A plain GLU without biases
    pays neither."""
    from paraplan.simulator.elementwise import EXPERT_BIAS_BYTES, GLU_CLAMP_BYTES

    model = load_model("gpt-oss-120b")
    assert model.glu_clamp == 7.0 and model.use_bias
    plain = model.model_copy(update={"glu_clamp": None, "use_bias": False})
    plan = ParallelPlan(ep=8, micro_batch_size=1)
    rows = moe.routed_copies_per_token(model, plan)
    assert rows == pytest.approx(model.moe_top_k)  # dropless, balanced, etp 1
    for kernels in ("fused", "eager"):
        tr = TrainingSpec(global_batch_size=64, seq_len=4096, kernels=kernels)
        extra = (elementwise_bytes_per_token(model, tr, plan, moe=True)
                 - elementwise_bytes_per_token(plain, tr, plan, moe=True))
        busiest = rows * moe.load_factor(tr, plan)
        assert extra == pytest.approx(busiest * (GLU_CLAMP_BYTES[kernels] * model.expert_ffn
                                                 + EXPERT_BIAS_BYTES[kernels] * model.hidden_size))


def test_hf_import_reads_the_swiglu_limit(tmp_path) -> None:
    import json

    from paraplan.specs.errors import SpecError
    from tests.test_model_params import HF

    cfg = json.loads((HF / "gpt-oss-20b.json").read_text())
    for bad in ("seven", -1, True):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**cfg, "swiglu_limit": bad}))
        with pytest.raises(SpecError, match="swiglu_limit"):
            load_model(str(path))
    path.write_text(json.dumps({**cfg, "swiglu_limit": 5}))
    assert load_model(str(path)).glu_clamp == 5.0


def test_yarn_rope_runs_unfused_under_megatron_core(tmp_path) -> None:
    """gpt-oss scales RoPE's cos and sin by YaRN's attention factor 0.1 ln 32 + 1 = 1.3466;
    Transformer Engine's fused RoPE takes no scale, so Megatron-Core applies it in unfused ops
    (24 B per q/k element forward instead of 4, rope_utils.py). A trainer whose fused kernel
    applies it (torchtitan compiles its own) and a factor of 1 pay nothing extra."""
    import json
    import math

    from paraplan.simulator.elementwise import UNFUSED_ROPE_BYTES
    from paraplan.specs.errors import SpecError
    from tests.test_formulas import load_trainer_training
    from tests.test_model_params import HF

    model = load_model("gpt-oss-120b")
    assert model.rope_attention_factor == pytest.approx(0.1 * math.log(32) + 1, abs=1e-4)
    plain = model.model_copy(update={"rope_attention_factor": None})
    plan = ParallelPlan(ep=8, micro_batch_size=1)
    base = TrainingSpec(global_batch_size=64, seq_len=4096)
    mcore = load_trainer_training("megatron-core", base)
    assert mcore.kernels == "fused" and not mcore.fused_rope_scales
    extra = (elementwise_bytes_per_token(model, mcore, plan, moe=True)
             - elementwise_bytes_per_token(plain, mcore, plan, moe=True))
    assert extra == pytest.approx((UNFUSED_ROPE_BYTES - 4.0) * model.attention.rope_width)
    titan = load_trainer_training("torchtitan", base)
    assert titan.fused_rope_scales
    assert elementwise_bytes_per_token(model, titan, plan, moe=True) == pytest.approx(
        elementwise_bytes_per_token(plain, titan, plan, moe=True))
    one = model.model_copy(update={"rope_attention_factor": 1.0})
    assert elementwise_bytes_per_token(one, mcore, plan, moe=True) == pytest.approx(
        elementwise_bytes_per_token(plain, mcore, plan, moe=True))
    # config.json: transformers' rule (attention_factor, else the mscale ratio, else the log).
    cfg = json.loads((HF / "gpt-oss-20b.json").read_text())
    assert load_model(str(HF / "gpt-oss-20b.json")).rope_attention_factor == pytest.approx(
        0.1 * math.log(32) + 1)
    path = tmp_path / "config.json"
    for scaling, want in (({"type": "yarn", "factor": 40, "mscale": 1.0,
                            "mscale_all_dim": 1.0}, 1.0),
                          ({"rope_type": "yarn", "factor": 4, "attention_factor": 1.2}, 1.2),
                          ({"rope_type": "llama3", "factor": 8.0}, None)):
        path.write_text(json.dumps({**cfg, "rope_scaling": scaling}))
        got = load_model(str(path)).rope_attention_factor
        assert got == (pytest.approx(want) if want is not None else None)
    path.write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "yarn", "factor": "x"}}))
    with pytest.raises(SpecError, match="rope_scaling.factor"):
        load_model(str(path))


@pytest.mark.parametrize("ep,etp,sp", [(8, 1, False), (32, 1, True), (4, 2, True)])
def test_the_attention_half_a_search_shares_prices_the_layer_as_computing_it(ep, etp, sp
                                                                              ) -> None:
    # The vectorized search computes the projections and attention once per (tp, cp, mbs)
    # and hands them to every MoE key with those (compute.attention_times): the layer must
    # come out bit for bit as when layer_times computes them itself.
    from paraplan.simulator.compute import attention_times
    from paraplan.simulator.layer_terms import layer_times

    model = load_model("deepseek-v3")
    training = TrainingSpec(global_batch_size=64, seq_len=4096, precision="fp8")
    dev = Device.of_training(load_cluster("dgx-h800").gpu, training)
    shared = attention_times(model, training, ParallelPlan(tp=2, cp=2, ep=2), dev)
    plan = ParallelPlan(tp=2, cp=2, ep=ep, etp=etp, sequence_parallel=sp)
    assert layer_times(model, training, plan, dev, moe=True, attention=shared) == \
        layer_times(model, training, plan, dev, moe=True)
    other_tp = ParallelPlan(tp=4, cp=2, ep=ep, etp=etp, sequence_parallel=sp)
    assert layer_times(model, training, other_tp, dev, moe=True, attention=shared) != \
        layer_times(model, training, other_tp, dev, moe=True)  # the key matters: tp does


def test_gb200_recipes_rerun_in_26_08_match_the_26_04_layouts() -> None:
    """NVIDIA's 26.08 table re-runs the four GB200 MoE recipes on the same GPUs and layouts
    (moe_sources.md, megatron_bridge_moe_2608): each row pairs with a 26.04.01 row, NVIDIA
    measured it faster, and paraplan predicts the newer settings (all-to-all overlap, MXFP8)
    faster as well."""
    from paraplan.simulator.step import simulate
    from paraplan.validate.published import load_published_throughput

    cases = load_published_throughput()
    old = {c.model.name: c for c in cases if c.source_id == "megatron_bridge_moe"
           and c.cluster is not None and c.cluster.gpu.name == "gb200"}
    new = [c for c in cases if c.source_id == "megatron_bridge_moe_2608"]
    assert len(new) == 4 and {c.model.name for c in new} == set(old)
    for case in new:
        before = old[case.model.name]
        for field in ("tp", "pp", "ep", "virtual_stages", "micro_batch_size"):
            assert getattr(case.plan, field) == getattr(before.plan, field), field
        assert case.num_gpus == before.num_gpus
        assert case.training.moe_a2a_overlap and case.training.precision == "fp8"
        assert case.measured_step_time_s < before.measured_step_time_s
        fast = simulate(case.model, case.cluster, case.training, case.plan, time_if_oom=True)
        slow = simulate(before.model, before.cluster, before.training, before.plan,
                        time_if_oom=True)
        assert fast.step_time_s is not None and slow.step_time_s is not None
        assert fast.step_time_s < slow.step_time_s


def test_alltoall_dispatcher_sorts_received_rows_by_local_expert() -> None:
    """Megatron-Core's all-to-all dispatcher copies the received rows into local-expert order
    and back (moe_utils.sort_chunks_by_idxs): 4 h elements per routed row, only with more
    than one local expert, not for the flex (DeepEP/HybridEP) dispatcher nor an eager stack
    (whose own count holds its gathers). Qwen3-30B-A3B, EP 16: 8 local experts, k = 8."""
    from paraplan.simulator.compute import dispatch_sort_time

    model = load_model("qwen3-30b-a3b")
    training = TrainingSpec(global_batch_size=1024, seq_len=4096, moe_load_imbalance=1.0,
                            moe_dispatcher="alltoall")
    plan = ParallelPlan(ep=16)
    assert moe.sort_elements_per_token(model, training, plan) == 4 * 2048 * 8
    hybrid = training.model_copy(update={"moe_dispatcher": "hierarchical"})
    eager = training.model_copy(update={"kernels": "eager"})
    assert moe.sort_elements_per_token(model, hybrid, plan) == 0.0
    assert moe.sort_elements_per_token(model, eager, plan) == 0.0
    assert moe.sort_elements_per_token(model, training, ParallelPlan(ep=128)) == 0.0
    # Under TP with sequence parallelism each rank dispatches s / tp tokens and the rows are
    # gathered over expert-TP first: per dispatched token k * etp rows.
    sp = ParallelPlan(tp=2, sequence_parallel=True, ep=16, etp=2)
    assert moe.sort_elements_per_token(model, training, sp) == 4 * 2048 * 8 * 2
    device = Device.of_training(load_cluster("dgx-h100", 2).gpu, training)
    by_hand = 4096 * (4 * 2048 * 8) * 2.0 / device.memory_Bps  # tokens x elements x bf16
    assert dispatch_sort_time(model, training, plan, device) == pytest.approx(by_hand)
    cluster = load_cluster("dgx-h100", 2)
    a2a = layer_parts(model, cluster.topology, training, plan, device, moe=True)
    flex = layer_parts(model, cluster.topology, hybrid, plan, device, moe=True)
    assert a2a.times.forward_s - flex.times.forward_s == pytest.approx(by_hand)
    assert a2a.times.backward_s - flex.times.backward_s == pytest.approx(by_hand)


def test_dispatch_sort_reads_the_plan_only_through_its_a2a_shape() -> None:
    """The evaluator keeps the sort with the all-to-all, memoized by ``moe.a2a_shape``: plans
    of one shape get the very same seconds (bit for bit), whatever their tp and micro-batch."""
    from paraplan.simulator.compute import dispatch_sort_time

    model = load_model("qwen3-30b-a3b")
    training = TrainingSpec(global_batch_size=1024, seq_len=4096, moe_dispatcher="alltoall")
    device = Device.of_training(load_cluster("dgx-h100", 2).gpu, training)
    one = ParallelPlan(tp=1, ep=8, micro_batch_size=1)
    other = ParallelPlan(tp=2, sequence_parallel=True, ep=8, etp=1, micro_batch_size=2)
    assert moe.a2a_shape(training, one) == moe.a2a_shape(training, other)
    assert dispatch_sort_time(model, training, one, device) == \
        dispatch_sort_time(model, training, other, device) > 0.0


def test_fp8_expert_inputs_are_cast_by_their_own_kernel() -> None:
    """Transformer Engine's grouped linear quantizes the permuted tokens and the activation
    output itself (tex.split_quantize), so each expert GEMM's fp8 cast also reads the 16-bit
    input (2 B per element) that a dense layer's norm would have cast in place; bf16 runs,
    eager casts (whose 5 B already read it) and block scaling (whose quantize kernel always
    reads it, ``FP8_BLOCK_QUANTIZE_EXTRA_BYTES``) are unchanged."""
    from paraplan.simulator.compute import gemm_time
    from paraplan.simulator.layer_terms import expert_gemm_time

    gpu = load_cluster("dgx-h100", 1).gpu
    fp8 = TrainingSpec(global_batch_size=8, seq_len=4096, precision="fp8", fp8_scaling="delayed")
    device = Device.of_training(gpu, fp8)
    m, n, k = 8192.0, 2048.0, 7168.0
    extra = gemm_time(device, m, n, k, own_cast=True) - gemm_time(device, m, n, k)
    assert extra == pytest.approx(2.0 * m * k / device.memory_Bps)
    for other in (TrainingSpec(global_batch_size=8, seq_len=4096),
                  fp8.model_copy(update={"kernels": "eager"}),
                  fp8.model_copy(update={"fp8_scaling": "block"})):
        dev = Device.of_training(gpu, other)
        assert gemm_time(dev, m, n, k, own_cast=True) == gemm_time(dev, m, n, k)
    # Qwen3-30B-A3B, EP 8: 16 local experts, each GEMM pair's inputs (h, then ffn) read once.
    model = load_model("qwen3-30b-a3b")
    plan = ParallelPlan(ep=8)
    rows = moe.expert_rows(model, fp8, plan)
    by_hand = 16 * 2.0 * rows * (2048 + 768) / device.memory_Bps
    plain = 16 * (gemm_time(device, rows, 2 * 768, 2048) + gemm_time(device, rows, 2048, 768))
    assert expert_gemm_time(model, fp8, plan, device) - plain == pytest.approx(by_hand)


def test_megatron_moe_host_stall_from_nvidias_profile() -> None:
    """Megatron-Core's per-layer sync stall is the idle time NVIDIA's Nsight profile shows on
    the 16-H100 Qwen3-30B HybridEP run (GPU active 22.821 s of a 24.7138 s step, 64
    micro-batches x 48 MoE layers), scaled on Grace hosts by TE issue #2053's host times."""
    runs = load_trainer("megatron-core").runs
    assert runs.moe_host_sync_s == pytest.approx((24.7138 - 22.821) / (64 * 48), rel=2e-3)
    assert load_cluster("gb200-nvl72", nodes=1).gpu.host_time_factor == \
        pytest.approx(37.08 / 13.48, rel=2e-3)
    assert load_cluster("dgx-h100", nodes=1).gpu.host_time_factor == 1.0
    # Sync-free MoE (full-iteration CUDA graphs) and other trainers: no stall.
    assert load_trainer("torchtitan").runs.moe_host_sync_s == 0.0


def test_host_stall_waits_in_the_forward_unless_a_backward_runs_beside_it() -> None:
    plan = ParallelPlan(tp=1, ep=32, etp=1)
    base = TrainingSpec(global_batch_size=64, seq_len=4096, moe_load_imbalance=1.0)
    stall = 6e-4
    for overlap in (False, True):
        tr = base.model_copy(update={"moe_a2a_overlap": overlap})
        quiet = compose_layer_cost(_parts(tr, plan), "none")
        loud = compose_layer_cost(_parts(tr.model_copy(update={"moe_host_sync_s": stall}),
                                         plan), "none")
        assert loud.compute == quiet.compute and loud.bwd == pytest.approx(quiet.bwd)
        if overlap:  # the paired backward keeps the GPU busy; a warm-up forward waits
            assert loud.fwd == pytest.approx(quiet.fwd)
            assert loud.ep_lone_fwd == pytest.approx(quiet.ep_lone_fwd + stall)
        else:
            assert loud.fwd == pytest.approx(quiet.fwd + stall)
            assert loud.ep == pytest.approx(quiet.ep + stall)
    # Full recomputation re-runs the forward, sync and all (never overlapped).
    tr = base.model_copy(update={"moe_host_sync_s": stall})
    full_q = compose_layer_cost(_parts(base, plan), "full")
    full_l = compose_layer_cost(_parts(tr, plan), "full")
    assert full_l.fwd + full_l.bwd == pytest.approx(full_q.fwd + full_q.bwd + 2 * stall)
    # A Grace host stalls longer: the GPU profile's host factor.
    model, gb = load_model("deepseek-v3"), load_cluster("gb200-nvl72", nodes=1)
    dev = Device.of_training(gb.gpu, tr)
    assert dev.moe_sync_stall_s == pytest.approx(stall * gb.gpu.host_time_factor)
    assert layer_parts(model, gb.topology, tr, plan, dev, moe=False).host_stall_s == 0.0


def test_no_host_stall_with_a_capacity_factor() -> None:
    """Megatron pads each expert's input to the capacity (--moe-pad-expert-input-to-capacity)
    and its dispatcher skips the device-to-host copy: no sync, no stall."""
    tr = TrainingSpec(global_batch_size=64, seq_len=4096, moe_host_sync_s=6e-4)
    dropless = _parts(tr, ParallelPlan(tp=1, ep=32, etp=1))
    padded = _parts(tr, ParallelPlan(tp=1, ep=32, etp=1, moe_capacity_factor=1.5))
    assert dropless.host_stall_s == pytest.approx(6e-4) and padded.host_stall_s == 0.0


def test_the_flex_dispatchers_sms_set_the_overlaps_share_of_compute() -> None:
    """``TrainingSpec.moe_dispatcher_sms``: the hierarchical dispatcher's kernels take that
    share of the GPU's SMs under the overlap (DeepEP's 20 by default; NVIDIA's HybridEP
    benchmarks 32, Megatron-Bridge ``_benchmark_common``); capped at the GPU's SMs; the NCCL
    all-to-all keeps NCCL's share; no share without the overlap."""
    from paraplan.simulator.layer import a2a_overlap_share

    gpu = load_cluster("dgx-h100", nodes=1).gpu
    plan = ParallelPlan(ep=8)
    base = TrainingSpec(global_batch_size=64, seq_len=4096, moe_dispatcher="hierarchical",
                        moe_a2a_overlap=True)
    dev = Device.of_training(gpu, base)

    def share(**update) -> float | None:
        return a2a_overlap_share(base.model_copy(update=update), plan, dev, moe=True)

    assert share() == pytest.approx(20 / 132)
    assert share(moe_dispatcher_sms=32) == pytest.approx(32 / 132)
    assert share(moe_dispatcher_sms=1000) == 1.0
    assert share(moe_dispatcher="alltoall", moe_dispatcher_sms=32) == dev.nccl_slowdown
    assert share(moe_a2a_overlap=False, moe_dispatcher_sms=32) is None
    with pytest.raises(ValueError):
        TrainingSpec(global_batch_size=64, seq_len=4096, moe_dispatcher_sms=0)


def test_nvidias_hybridep_rows_run_on_32_sms() -> None:
    """The bundled Megatron-Bridge MoE rows that run HybridEP carry the 32 SMs NVIDIA's
    benchmark harness gives it; the DeepEP and all-to-all rows keep the default."""
    from paraplan.validate.published import load_published_throughput

    rows = [r for r in load_published_throughput() if r.model.is_moe]
    sms = {r.training.moe_dispatcher_sms for r in rows
           if r.training.moe_dispatcher == "hierarchical"}
    assert sms == {None, 32}
    assert all(r.training.moe_dispatcher_sms is None for r in rows
               if r.training.moe_dispatcher == "alltoall")
    assert sum(r.training.moe_dispatcher_sms == 32 for r in rows) == 12
