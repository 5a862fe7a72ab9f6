"""Cost-model formulas against hand-worked and published numbers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan import ModelSpec, ParallelPlan, TrainingSpec, load_cluster, load_model, parse_plan
from paraplan.simulator import collectives as coll
from paraplan.simulator.compute import Device, gemm_time, wave_efficiency
from paraplan.simulator.flops import (
    hardware_flops_per_step,
    megatron_flops_per_step,
    model_flops_per_step,
)
from paraplan.simulator.memory import korthikanti_layer_bytes, layer_activation_bytes


def gpt_like(layers=96, h=12288, heads=96, vocab=51200) -> ModelSpec:
    return ModelSpec(name="gpt", num_layers=layers, hidden_size=h, num_attention_heads=heads,
                     ffn_hidden_size=4 * h, vocab_size=vocab, activation="gelu")


def test_model_flops_equal_megatron_72_formula():
    m = gpt_like()
    b, s = 1536, 2048
    assert model_flops_per_step(m, b, s) == pytest.approx(
        megatron_flops_per_step(m, b, s, recompute=False), rel=1e-12)
    # Hand-worked: 72*B*s*l*h^2*(1 + s/(6h) + v/(12 l h)) for GPT-3 175B at B=1536, s=2048.
    hand = 72 * 1536 * 2048 * 96 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (12 * 96 * 12288))
    assert model_flops_per_step(m, b, s) == pytest.approx(hand, rel=1e-12)
    assert hand == pytest.approx(3.3862e18, rel=1e-4)  # ~ 6 * 175e9 * 3.15M tokens


def test_hardware_flops_with_full_recompute_equal_megatron_96_formula():
    m = gpt_like()
    assert hardware_flops_per_step(m, 512, 2048, "full") == pytest.approx(
        megatron_flops_per_step(m, 512, 2048, recompute=True), rel=1e-12)


def test_six_n_t_rule_of_thumb():
    # Kaplan et al. 2020: training FLOPs ~ 6 * params * tokens when s << 6h.
    m = load_model("llama3-70b")
    tokens = 1024 * 2048
    approx = 6 * m.num_params * tokens
    assert model_flops_per_step(m, 1024, 2048) == pytest.approx(approx, rel=0.08)


@pytest.mark.parametrize(("t", "sp", "sel"), [(1, False, False), (8, False, False),
                                              (8, True, False), (8, True, True), (4, False, True)])
def test_activation_memory_matches_korthikanti(t, sp, sel):
    m = gpt_like()
    tr = TrainingSpec(global_batch_size=8, seq_len=2048, dropout=True, flash_attention=False)
    plan = ParallelPlan(tp=t, sequence_parallel=sp, recompute="selective" if sel else "none")
    got = layer_activation_bytes(m, tr, plan, 1, moe=False)
    assert got == pytest.approx(korthikanti_layer_bytes(2048, 1, 12288, 96, t, sp=sp,
                                                        selective=sel), rel=1e-12)


def test_korthikanti_gpt3_numbers_by_hand():
    # s*b*h*(34 + 5as/h) with s=2048, b=1, h=12288, a=96: 34 + 80 = 114 -> 2.869e9 bytes/layer.
    assert korthikanti_layer_bytes(2048, 1, 12288, 96) == 2048 * 12288 * 114
    # TP=8 without SP: 10 + 24/8 + 80/8 = 23.
    assert korthikanti_layer_bytes(2048, 1, 12288, 96, 8) == 2048 * 12288 * 23


def test_full_recompute_keeps_layer_input_only():
    m = gpt_like()
    tr = TrainingSpec(global_batch_size=8, seq_len=2048)
    plan = ParallelPlan(tp=8, sequence_parallel=True, recompute="full")
    assert layer_activation_bytes(m, tr, plan, 1, moe=False) == 2 * 2048 * 12288 / 8


def test_ring_all_reduce_by_hand():
    # 1 GB over 8 ranks at 100 GB/s with 10 us steps: 2*7*10us + 2*7/8*1e9/1e11 = 17.64 ms.
    assert coll.ring_all_reduce(1e9, 8, 100e9, 10e-6) == pytest.approx(0.01764, rel=1e-12)
    assert coll.ring_all_gather(1e9, 8, 100e9, 10e-6) == pytest.approx(0.00882, rel=1e-12)
    assert coll.ring_all_reduce(1e9, 1, 100e9, 10e-6) == 0.0
    assert coll.p2p(1e6, 1e9, 1e-3) == pytest.approx(2e-3)


def test_group_all_reduce_on_nvlink_vs_ib():
    topo = load_cluster("dgx-h100", nodes=2).topology
    intra = coll.group_collective(topo, range(8), "all_reduce", 1e9)
    inter = coll.group_collective(topo, [0, 8], "all_reduce", 1e9)
    assert intra < inter  # NVLink ring beats one IB port per GPU


def test_gemm_roofline_regimes():
    dev = Device.of(load_cluster("dgx-a100-80gb").gpu, "bf16")  # no measured table: roofline
    big = gemm_time(dev, 8192, 8192, 8192)
    # 8192x8192 output in 128x256 tiles: 2048 tiles = 16 waves on 132 SMs -> 2048/2112;
    # on the A100's 108 SMs: 19 waves of 108 = 2052 slots -> 2048/2052.
    assert wave_efficiency(8192, 8192, 132) == pytest.approx(2048 / 2112)
    assert wave_efficiency(8192, 8192, 108) == pytest.approx(2048 / 2052)
    assert big == pytest.approx(2 * 8192**3 / (dev.matmul_flops * 2048 / 2052),
                                rel=0.01)  # compute-bound
    skinny = gemm_time(dev, 1, 8192, 8192)
    assert skinny == pytest.approx(2 * 8192 * 8192 / dev.memory_Bps, rel=0.05)  # memory-bound


def test_measured_gemm_table_interpolates_in_log_space():
    from paraplan.specs import load_gpu
    from paraplan.specs.loaders import load_gemm_table

    table = load_gemm_table("sm_90")
    # Grid point: b=1, 4096^3 measured 783.329 TF (and b=2/b=4 at m=2048/1024 fold into m=4096).
    assert table.efficiency(16384, 4096, 4096) == pytest.approx(793.131 / 989)
    mid = table.efficiency(4096, 4096, 3000)  # between k=2048 and k=4096
    lo, hi = table.efficiency(4096, 4096, 2048), table.efficiency(4096, 4096, 4096)
    assert min(lo, hi) <= mid <= max(lo, hi)
    # An output dimension beyond the grid folds into the other (same m x n: the measured
    # throughput follows the output's area, not its shape); both beyond clamp at the edges;
    # a longer k than measured extrapolates.
    assert table.efficiency(2048, 9216, 4096) == table.efficiency(4608, 4096, 4096)
    assert table.efficiency(65536, 1024, 4096) == table.efficiency(16384, 4096, 4096)
    assert table.efficiency(1e6, 1e6, 4096) == table.efficiency(16384, 4096, 4096)
    assert table.efficiency(1e6, 1e6, 1e6) == pytest.approx(table.best_tflops / 989)
    assert table.efficiency(256, 256, 256) < 0.05  # tiny GEMMs are launch-bound
    dev = Device.of(load_gpu("h100-sxm"), "bf16")
    t = gemm_time(dev, 16384, 4096, 4096)
    # The table is a burst measurement; its best over the large squares (8192^3 and 16384^3
    # reach the table's fastest shape, 808.7 TF/s, once their k is extrapolated) is scaled to
    # the sustained cuBLAS BF16 measured after the clock settles at 700 W: 0.7077 of peak
    # (hardware_profiles/gpus/h100-sxm.yaml sources); this shape keeps its ratio to it.
    best = table.best_square_efficiency((4096, 8192, 16384))
    assert best == pytest.approx(table.best_tflops / 989) == pytest.approx(808.7 / 989)
    assert t == pytest.approx(2 * 16384 * 4096 * 4096 / (989e12 * 0.7077 * 793.131 / 989 / best),
                              rel=1e-9)


def test_gemm_table_extrapolates_a_long_k_by_its_per_tile_time():
    # Beyond the grid's k = 4096 each output tile loops longer: time = a + b*k from the two
    # longest measured k at the same (m, n), capped at the table's fastest shape. 2048 rows,
    # n=4096: the grid's k=2048 and k=4096 values (b=1, 2, 4 entries folded into m).
    from paraplan.specs.loaders import load_gemm_table

    table = load_gemm_table("sm_90")
    tf1, tf2 = (table.efficiency(2048, 4096, k) * 989 for k in (2048, 4096))
    assert 700 < tf1 < tf2 < 760
    t1, t2 = 2048 / tf1, 4096 / tf2  # time per (2 m n) FLOPs, arbitrary units
    per_k = (t2 - t1) / 2048
    for k in (8192, 12288, 65536):
        expect = min(table.best_tflops, k / (t2 + per_k * (k - 4096)))
        assert table.efficiency(2048, 4096, k) * 989 == pytest.approx(expect, rel=1e-9)
    effs = [table.efficiency(2048, 4096, k) for k in (4096, 8192, 16384, 1e6)]
    assert effs == sorted(effs) and effs[-1] <= table.best_tflops / 989


def test_sustained_gemm_figure_sets_the_level_and_the_table_the_shape():
    """H100 SXM: large GEMMs at TileOPs' measured sustained 0.7077 (BF16) and 0.6303 (FP8) of
    the dense peaks; smaller shapes keep the table's ratio to its largest square; attention
    keeps burst x clock fraction; a power cap scales all of it."""
    from paraplan.specs import load_gpu

    h100 = load_gpu("h100-sxm")
    table = h100.gemm_table
    bf16, fp8 = Device.of(h100, "bf16"), Device.of(h100, "fp8")
    assert bf16.matmul_flops == pytest.approx(989e12 * 0.7077)
    assert fp8.matmul_flops == pytest.approx(1979e12 * 0.6303)
    # 8192^3 runs at the table's best large square (16384^3, the level measured) within 0.1%:
    # folded to 16384 x 4096 outputs (``GemmTable._fold``) at an extrapolated k = 8192.
    flops = 2 * 8192.0 ** 3
    assert gemm_time(fp8, 8192, 8192, 8192) == pytest.approx(
        flops / (1979e12 * 0.6303) + fp8.fp8_cast_bytes * 2 * 8192 ** 2 / fp8.memory_Bps,
        rel=1e-3)
    ratio = table.efficiency(1024, 4096, 2048) / table.best_square_efficiency((4096, 8192,
                                                                               16384))
    assert 0 < ratio < 1
    assert gemm_time(bf16, 1024, 4096, 2048) == pytest.approx(
        2 * 1024 * 4096 * 2048 / (989e12 * 0.7077 * ratio))
    assert bf16.attention_fwd_flops == pytest.approx(989e12 * 0.35 * 0.921)
    capped = Device.of(h100.model_validate({**h100.model_dump(), "power_limit_W": 500}), "bf16")
    frac = 0.805 + (1.0 - 0.805) * 50 / 250  # the measured power curve at 500 W
    assert capped.matmul_flops == pytest.approx(989e12 * 0.7077 * frac, rel=1e-3)
    assert gemm_time(capped, 8192, 8192, 8192) == pytest.approx(
        flops / (989e12 * 0.7077 * frac), rel=1e-3)
    # Without the measured figure the profile falls back to burst x clock fraction.
    plain = Device.of(h100.model_copy(update={"sustained_matmul_efficiency": None,
                                              "sustained_matmul_efficiency_fp8": None}), "bf16")
    assert plain.matmul_flops == pytest.approx(989e12 * 0.803 * 0.921)


def test_sustained_clock_scales_compute_not_memory():
    from paraplan.specs import load_gpu

    a100 = load_gpu("a100-sxm-80gb")
    burst = Device.of(a100.model_copy(update={"sustained_clock_fraction": 1.0}), "bf16")
    held = Device.of(a100, "bf16")
    assert a100.sustained_clock_fraction == pytest.approx(1305 / 1410, abs=1e-3)
    assert held.matmul_flops == pytest.approx(burst.matmul_flops * 0.926)
    assert held.attention_fwd_flops == pytest.approx(burst.attention_fwd_flops * 0.926)
    assert held.memory_Bps == burst.memory_Bps
    # B200 (HGX, 1000 W): FlashAttention-4 back to back fell from 1450 to 1237 TFLOPS as the
    # clock settled (flashinfer PR #2899); GEMMs and attention both carry it.
    b200 = load_gpu("b200")
    assert b200.sustained_clock_fraction == pytest.approx(1237 / 1450, abs=1e-3)
    free = Device.of(b200.model_copy(update={"sustained_clock_fraction": 1.0}), "bf16")
    assert Device.of(b200, "bf16").matmul_flops == pytest.approx(free.matmul_flops * 0.853)
    assert Device.of(b200, "bf16").attention_bwd_flops == pytest.approx(
        free.attention_bwd_flops * 0.853)


def test_v100_gemms_run_at_the_measured_sxm2_rate():
    """V100 SXM2: torch.mm of random 8192^2 FP16 matrices on a V100-SXM2-16GB ran 97.36 of
    125 TFLOPS (0.779; the old 0.9 was a V100 PCIe's ratio to its own 112). Both V100 SXM2
    profiles price the same die; no sustained-clock factor on top (the figure is warmed)."""
    from paraplan.specs import load_gpu

    for name in ("v100-sxm2-16gb", "v100-sxm2-32gb"):
        v100 = load_gpu(name)
        dev = Device.of(v100, "fp16")
        assert v100.sustained_clock_fraction == 1.0
        assert dev.matmul_flops == pytest.approx(97.36e12, rel=2e-3)
        flops = 2 * 8192.0 ** 3
        assert gemm_time(dev, 8192, 8192, 8192) == pytest.approx(flops / 97.36e12, rel=0.02)


def test_power_limit_follows_the_measured_power_curve_of_the_same_system():
    """H100 SXM under a cap: NVIDIA's MLPerf Inference v4.0 ran the same 8x H100 SXM system
    at 700 W and at 450 W / 350 W: Llama2-70B Offline 21,805.8 -> 17,561.6 tokens/s (0.805),
    GPT-J Offline 239.895 -> 178.896 samples/s (0.746). At 500 W (Grand Teton's default, the
    HBM2e part): 0.805 + 0.195 * 50 / 250 = 0.844 of the 700 W compute; memory bandwidth
    untouched. H200 (v4.1): Llama2-70B 31,302.7 -> 25,262.1 at 500 W (0.807)."""
    from paraplan.specs import load_gpu

    sxm = load_gpu("h100-sxm")
    assert sxm.power_fraction == 1.0  # no limit set: the TDP
    capped = sxm.model_validate({**sxm.model_dump(), "power_limit_W": 500})
    assert capped.power_fraction == pytest.approx(0.844, abs=1e-4)
    at450 = sxm.model_validate({**sxm.model_dump(), "power_limit_W": 450})
    assert at450.power_fraction == pytest.approx(17561.6 / 21805.8, abs=1e-3)
    at350 = sxm.model_validate({**sxm.model_dump(), "power_limit_W": 350})
    assert at350.power_fraction == pytest.approx(178.896 / 239.895, abs=1e-3)
    h200 = load_gpu("h200")
    at500 = h200.model_validate({**h200.model_dump(), "power_limit_W": 500})
    assert at500.power_fraction == pytest.approx(25262.1 / 31302.7, abs=1e-3)
    full, low = Device.of(sxm, "bf16"), Device.of(capped, "bf16")
    assert low.matmul_flops == pytest.approx(full.matmul_flops * capped.power_fraction)
    assert low.attention_bwd_flops == pytest.approx(full.attention_bwd_flops
                                                    * capped.power_fraction)
    assert low.table_scale == pytest.approx(full.table_scale * capped.power_fraction)
    assert low.memory_Bps == full.memory_Bps
    assert load_gpu("h100-sxm-hbm2e").power_limit_W == 500


def test_overlapped_collectives_take_the_sms_of_their_nccl_channels():
    """NCCL runs one thread block per channel: 24 on NVSwitch A100/H100 boxes (its ring
    search's 12, doubled), 16 on the 8-NVLink H800; a collective lasting C seconds under
    compute costs C * channels / SMs. A profile that cites none keeps the generic 16."""
    from paraplan.simulator.compute import NCCL_SMS
    from paraplan.specs import load_gpu

    h100, h800, a100 = (Device.of(load_gpu(n), "bf16") for n in ("h100-sxm", "h800",
                                                                  "a100-sxm-80gb"))
    assert h100.nccl_slowdown == pytest.approx(24 / 132)
    assert h800.nccl_slowdown == pytest.approx(16 / 132)
    assert a100.nccl_slowdown == pytest.approx(24 / 108)
    l40s = load_gpu("l40s")
    assert l40s.nccl_channels is None
    assert Device.of(l40s, "bf16").nccl_slowdown == pytest.approx(NCCL_SMS / 142)
    with pytest.raises(ValueError, match="nccl_channels"):
        l40s.model_validate({**l40s.model_dump(), "nccl_channels": 0})


def test_gradient_accumulation_pass_bytes_by_trainer():
    """Per parameter per micro-batch: fused 0; eager AccumulateGrad 3 x 2 B; DeepSpeed's BF16
    optimizer ``hp_grad.add_(lp.grad.to(fp32))``: read 2 B, write the fp32 copy 4, read it
    and the fp32 buffer 4 + 4, write the buffer 4 = 18 B. None under ZeRO-2/3."""
    from paraplan.simulator.grads import accumulation_bytes_per_param, accumulation_time

    tr = TrainingSpec(global_batch_size=64, seq_len=2048)
    assert accumulation_bytes_per_param(tr) == 0.0
    assert accumulation_bytes_per_param(tr.model_copy(update={"kernels": "eager"})) == 6.0
    bf16 = load_trainer_training("megatron-deepspeed-2022", tr)
    assert bf16.grad_accumulation == "fp32_add" and accumulation_bytes_per_param(bf16) == 18.0
    # ... and keeps the fp32 gradients and the last backward's bf16 .grad: 4 + 2 B per parameter
    assert bf16.grad_buffer_bytes == 6
    fp16 = load_trainer_training("megatron-deepspeed-2022",
                                 tr.model_copy(update={"precision": "fp16"}))
    assert fp16.grad_accumulation == "eager" and accumulation_bytes_per_param(fp16) == 6.0
    assert load_trainer_training("megatron-core", tr).grad_accumulation is None
    # Megatron without --gradient-accumulation-fusion: main_grad.add_(grad) into the fp32
    # buffer reads 2 + 4 B and writes 4 B.
    unfused = tr.model_copy(update={"grad_accumulation": "eager", "grad_reduce_fp32": True})
    assert accumulation_bytes_per_param(unfused) == 10.0
    # DeepSpeed's exported bf16 config (fp32 grad_accum_dtype) runs the BF16 optimizer, with
    # DeepSpeed's 5e8-element buckets.
    ds = load_trainer_training("deepspeed", tr)
    assert ds.grad_accumulation == "fp32_add" and ds.ddp_bucket_size == 500_000_000
    dev = Device.of(load_cluster("dgx-a100-80gb").gpu, "bf16")
    secs = accumulation_time(1e9, bf16, ParallelPlan(zero_stage=1), dev)
    assert secs == pytest.approx(18e9 / dev.memory_Bps)
    assert accumulation_time(1e9, bf16, ParallelPlan(zero_stage=2), dev) == 0.0


def test_gradient_buckets_grow_with_the_data_parallel_size():
    """Megatron-Core's default bucket is max(40M, 1M x dp) parameters, so a ZeRO-1 sync over
    512 ranks pays the ring latency on 8 buckets of a 4B-parameter shard, not 100."""
    from paraplan.simulator.dp_sync import grad_sync_parts
    from paraplan.simulator.memory import dp_bucket_elements

    assert dp_bucket_elements(8) == 40e6 and dp_bucket_elements(512) == 512e6
    assert dp_bucket_elements(512, 100_000_000) == 1e8  # --ddp-bucket-size / reduce_bucket_size
    assert dp_bucket_elements(np.array([8, 512]), 7).tolist() == [7.0, 7.0]
    topo = load_cluster("dgx-h100", nodes=64).topology
    group = tuple(range(512))
    tr = TrainingSpec(global_batch_size=4096, seq_len=4096)
    rs, ag = grad_sync_parts(topo, group, MODEL_8B, ParallelPlan(zero_stage=1), tr, 4.096e9)
    ring = topo.ring(group)
    latency = 511 * ring.latency_s
    assert rs == pytest.approx(8 * latency + 511 / 512 * 4.096e9 * tr.grad_reduce_bytes
                               / (ring.bandwidth_GBps * 1e9))
    small = tr.model_copy(update={"ddp_bucket_size": 256_000_000})  # 16 buckets
    rs16, _ = grad_sync_parts(topo, group, MODEL_8B, ParallelPlan(zero_stage=1), small, 4.096e9)
    assert rs16 - rs == pytest.approx(8 * latency)


def test_deepspeed_bf16_zero1_all_reduces_the_whole_gradient():
    """DeepSpeed's pipeline engine with the BF16 optimizer all-reduces the fp32 gradient in
    full before its ZeRO-1 step; Megatron's distributed optimizer reduce-scatters it."""
    from paraplan.simulator import collectives as coll
    from paraplan.simulator.dp_sync import grad_sync_parts

    cl = load_cluster("dgx-a100-80gb", nodes=8)
    model = load_model("gpt3-2.7b")
    tr = TrainingSpec(global_batch_size=256, seq_len=2048, grad_reduce_fp32=True)
    group = tuple(range(0, 64, 8))
    plan = ParallelPlan(tp=8, zero_stage=1)
    rs, ag = grad_sync_parts(cl.topology, group, model, plan, tr, 1e9)
    full, ag2 = grad_sync_parts(cl.topology, group, model, plan,
                                tr.model_copy(update={"zero1_grad_all_reduce": True}), 1e9)
    assert ag2 == ag
    assert full == pytest.approx(2 * rs * coll.kind_efficiency(cl.topology, "reduce_scatter"))
    ds = load_trainer_training("megatron-deepspeed-2022", tr)
    assert ds.zero1_grad_all_reduce
    assert not load_trainer_training("megatron-deepspeed-2022",
                                     tr.model_copy(update={"precision": "fp16"})
                                     ).zero1_grad_all_reduce


def load_trainer_training(name: str, training: TrainingSpec) -> TrainingSpec:
    from paraplan.specs.loaders import load_trainer
    from paraplan.specs.trainer import trainer_training

    return trainer_training(load_trainer(name), training)


def test_power_limit_off_the_curve_is_refused(tmp_path):
    from paraplan.specs import SpecError, load_gpu
    from paraplan.specs.loaders import load_cluster

    sxm = load_gpu("h100-sxm")
    with pytest.raises(ValueError, match="power_limit_W=300 is below"):
        sxm.model_validate({**sxm.model_dump(), "power_limit_W": 300})
    a100 = load_gpu("a100-sxm-80gb")  # no power curve: only limits at or above its TDP
    with pytest.raises(ValueError, match="no power_curve"):
        a100.model_validate({**a100.model_dump(), "power_limit_W": 300, "tdp_W": 400})
    with pytest.raises(ValueError, match="no tdp_W and no power_curve"):
        a100.model_validate({**a100.model_dump(), "power_limit_W": 300, "tdp_W": None})
    path = tmp_path / "c.yaml"
    path.write_text("name: c\nnode: {gpu: h100-sxm, gpus_per_node: 8, intra_node_link: nvlink4,"
                    " inter_node_link: ib-ndr, gpu_power_limit_W: 250}\n")
    with pytest.raises(SpecError) as err:
        load_cluster(str(path))
    assert err.value.field == "cluster.node.gpu_power_limit_W"
    assert "350 W or more" in str(err.value.allowed)
    # A capped group is its own GPU type: a stage on it is priced capped whatever the order.
    mixed = tmp_path / "mixed.yaml"
    group = "{gpu: h100-sxm, gpus_per_node: 8, intra_node_link: nvlink4, inter_node_link: ib-ndr"
    mixed.write_text(f"name: m\nnode_groups:\n  - {group}}}\n  - {group}, "
                     "gpu_power_limit_W: 400}\n")
    cluster = load_cluster(str(mixed))
    assert [g.gpu.name for g in cluster.node_groups] == ["h100-sxm", "h100-sxm@400W"]
    # 400 W: halfway between the measured 350 W (0.746) and 450 W (0.805) points
    assert cluster.node_groups[1].gpu.power_fraction == pytest.approx(0.7755)


def test_loss_passes_by_implementation_by_hand():
    """Cross entropy traffic per 16-bit logit (simulator.loss): flash-attn's one-kernel loss
    reads the logits forward (2 B) and reads them and writes the gradient backward (4 B);
    each Composer training metric is an eager fp32 cross entropy forward (22 B). MPT-7B's
    micro-batch of 128 x 512 tokens on an A100 80GB: 65,536 x 50,432 logits at 2,039 GB/s x
    0.84; llm-foundry's 2 + 2 x 22 = 46 B forward and 4 B backward against the generic
    20 B and 20 B."""
    from paraplan.simulator.loss import lm_head_times, loss_bytes_per_logit_moved
    from paraplan.specs.loaders import load_trainer
    from paraplan.specs.trainer import trainer_training

    training = trainer_training(load_trainer("llm-foundry"),
                                TrainingSpec(global_batch_size=256, seq_len=512))
    assert (training.loss_kernels, training.logit_metric_passes) == ("one_kernel", 2)
    assert loss_bytes_per_logit_moved(training) == (2.0 + 2 * 22.0, 4.0)
    generic = TrainingSpec(global_batch_size=256, seq_len=512)
    assert loss_bytes_per_logit_moved(generic) == (20.0, 20.0)
    assert loss_bytes_per_logit_moved(generic.model_copy(update={"loss_kernels": "eager"})) \
        == (22.0, 22.0)
    # No loss_kernels: the loss runs the kernels the rest of the model does (eager: 22 B).
    assert loss_bytes_per_logit_moved(generic.model_copy(update={"kernels": "eager"})) \
        == (22.0, 22.0)
    model, plan = load_model("mpt-7b"), parse_plan("tp=1,mbs=128")
    dev = Device.of(load_cluster("dgx-a100-80gb", nodes=1).gpu, "bf16")
    (f1, b1), (f0, b0) = (lm_head_times(model, t, plan, dev) for t in (training, generic))
    assert model.vocab_size == 50432
    logits_s = 128 * 512 * 50432 / (2039e9 * 0.84)
    assert f1 - f0 == pytest.approx((46.0 - 20.0) * logits_s, rel=1e-9)
    assert b1 - b0 == pytest.approx((4.0 - 20.0) * logits_s, rel=1e-9)


def test_b200_gemms_read_the_measured_tables_by_dtype():
    """B200 GEMMs come from OpenXLA's sm_100_B200 table (hardware_profiles/gemm/README.md):
    bf16 m=256, n=k=4096 at 651.394 TFLOPS; e4m3 from its own column (930.452), not the bf16
    one scaled by the large-GEMM fp8 ratio; both burst measurements, run at the B200's
    sustained clock fraction (0.853)."""
    from paraplan.specs import load_gpu

    b200 = load_gpu("b200")
    bf16, fp8 = Device.of(b200, "bf16"), Device.of(b200, "fp8")
    flops = 2 * 256 * 4096 * 4096
    held = b200.sustained_clock_fraction
    assert gemm_time(bf16, 256, 4096, 4096) == pytest.approx(flops / (651.394e12 * held),
                                                             rel=1e-6)
    assert gemm_time(fp8, 256, 4096, 4096) == pytest.approx(
        flops / (930.452e12 * held) + 2.0 * (256 * 4096 + 4096 * 4096) / fp8.memory_Bps,
        rel=1e-6)
    assert load_gpu("gb200").gemm_table_fp8.name == "sm_100_fp8"


def test_gb200_gemms_run_the_b200_table_at_gb200s_measured_level():
    """GB200 reads the B200's measured table (sm_100) for the shape profile, at its own
    measured best-GEMM level: stas00's MAMF is 1822 / 2500 BF16 on GB200 against 1745 / 2250
    on B200, so a GB200 GEMM runs 1822/1745 = 1.044x a B200 burst one, not 2500/2250 = 1.111x
    (the rated peaks); fp8 3615.6 / 3432.5 = 1.053x. Both then run at their sustained clock:
    B200 its measured 0.853, GB200 the level NVIDIA's own A/Bs put it at: the same
    Megatron-Bridge Llama3-8B recipe on 8 GPUs trains 1.029, 1.009, 1.045 and 1.018x as
    fast on GB200 as on B200 (mean 1.025), so 1.025 x 0.853 / (1822/1745) = 0.838."""
    from paraplan.specs import load_gpu

    b200, gb200 = load_gpu("b200"), load_gpu("gb200")
    ab = (31508 / 30624 + 29789 / 29521 + 31357 / 29994 + 29925 / 29388) / 4
    assert gb200.sustained_clock_fraction == pytest.approx(ab * 0.853 * 1745 / 1822, abs=5e-4)
    held, gb_held = b200.sustained_clock_fraction, gb200.sustained_clock_fraction
    for m, n, k in ((256, 4096, 4096), (8192, 8192, 8192), (1024, 512, 2048)):
        fast = gemm_time(Device.of(gb200, "bf16"), m, n, k)
        slow = gemm_time(Device.of(b200, "bf16"), m, n, k)
        assert slow * held / (fast * gb_held) == pytest.approx(1822 / 1745, rel=2e-3)
    # Sustained, a large GB200 GEMM runs at the A/Bs' ratio of a sustained B200 one.
    big = (8192, 8192, 8192)
    assert gemm_time(Device.of(b200, "bf16"), *big) / gemm_time(Device.of(gb200, "bf16"), *big) \
        == pytest.approx(ab, rel=2e-3)
    bf16 = Device.of(gb200, "bf16")
    assert bf16.gemm_table.efficiency(8192, 8192, 8192) * bf16.table_scale * 2500 == \
        pytest.approx(b200.gemm_table.efficiency(8192, 8192, 8192) * 2250 * 1822 / 1745
                      * gb_held, rel=2e-3)
    fp8 = Device.of(gb200, "fp8")  # the fp8 table at 0.723 of 5000 where B200 has 0.763
    assert fp8.table_scale / gb_held * 5000 / (Device.of(b200, "fp8").table_scale / held
                                               * 4500) == pytest.approx(3615.6 / 3432.5,
                                                                        rel=2e-3)


def test_unknown_gemm_table_is_a_spec_error():
    from paraplan.specs import SpecError
    from paraplan.specs.loaders import load_gemm_table

    with pytest.raises(SpecError, match="unknown gemm_table 'sm_42'"):
        load_gemm_table("sm_42")


def test_op_level_checkpointing_keeps_input_attention_and_every_other_matmul():
    # Llama 3 8B, no TP: torchtitan's block calls wq, wk, wv, wo, w1, w3, w2 in that order and
    # the op-level policy keeps every odd-numbered output: layer input 4096 + attention output
    # 4096 + q 4096 + v 1024 + w1 14336 + w2 4096 = 31744 elements per token.
    from paraplan.simulator.memory import op_checkpoint_elements

    m = load_model("llama3-8b")
    plan = ParallelPlan(recompute="op")
    tr = TrainingSpec(global_batch_size=8, seq_len=8192)
    assert op_checkpoint_elements(m, tr, plan, moe=False) == 4096 + 4096 + 23552
    assert layer_activation_bytes(m, tr, plan, 1, moe=False) == 8192 * 31744 * 2
    # Hardware FLOPs: wk, wo and w3 run again, 36.5% of the layer's matmul FLOPs.
    from paraplan.simulator.flops import layer_forward_flops

    extra = hardware_flops_per_step(m, 8, 8192, "op") - model_flops_per_step(m, 8, 8192)
    rerun = 2.0 * 8 * 8192 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336)
    assert extra == pytest.approx(32 * rerun)
    share = rerun / layer_forward_flops(m, 8, 8192, moe=False).gemm
    assert share == pytest.approx(79_691_776 / 218_103_808)  # 0.365


def test_tree_all_reduce_wins_for_small_messages_on_many_ranks():
    # 1 KB over 1024 ranks at 10 us per step: ring pays 2*1023 steps (20.5 ms), the double
    # binary tree 2*10 steps (0.2 ms); for 1 GB the ring's 2(n-1)/n*S/B beats the tree's 2S/B.
    ring_small = coll.ring_all_reduce(1e3, 1024, 25e9, 10e-6)
    tree_small = coll.tree_all_reduce(1e3, 1024, 25e9, 10e-6)
    assert tree_small == pytest.approx(20 * 10e-6 + 2 * 1e3 / 25e9)
    assert tree_small < ring_small / 50
    assert coll.ring_all_reduce(1e9, 8, 25e9, 10e-6) < coll.tree_all_reduce(1e9, 8, 25e9, 10e-6)
    topo = load_cluster("dgx-h100", nodes=128).topology
    group = tuple(range(0, 1024, 8))
    got = coll.group_collective(topo, group, "all_reduce", 1e3)
    ring = topo.ring(group)
    assert got == pytest.approx(coll.tree_all_reduce(1e3, 128, ring.bandwidth_GBps * 1e9,
                                                     ring.latency_s))


@pytest.mark.parametrize(("nbytes", "measured_s"), [(1 << 20, 0.079e-3), (64 << 20, 0.652e-3),
                                                    (1 << 30, 8.14e-3)])
def test_all_reduce_reproduces_galvatron_a100_measurements(nbytes, measured_s):
    # Galvatron's sp_time_1nodes_8gpus_per_node.json (shared/hardware_facts.md): 8 x A100 on
    # NVLink3, all-reduce of 1 MB / 64 MB / 1 GB. The alpha-beta ring with the nvlink3 profile
    # (5 us per step, 300 GB/s x 0.78) must land within 15% across the size range.
    topo = load_cluster("dgx-a100-80gb").topology
    got = coll.group_collective(topo, tuple(range(8)), "all_reduce", nbytes)
    assert got == pytest.approx(measured_s, rel=0.15)


def test_user_gemm_table_from_a_path(tmp_path):
    # A user-measured table (e.g. from their own GPU) plugs into a GPU profile by path.
    from paraplan.specs import SpecError, load_gpu
    from paraplan.specs.loaders import load_gemm_table

    rows = ["b,m,n,k,dtype,tflops"]
    for m in (1024, 4096):
        for n in (1024, 4096):
            for k in (1024, 4096):
                rows.append(f"1,{m},{n},{k},bf16xbf16->bf16,{100 if m * n * k < 4096**3 else 200}")
    (tmp_path / "mine.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "mine.yaml").write_text("name: mine\nreference_peak_tflops: 250\n"
                                        "csv: mine.csv\ndtype: bf16xbf16->bf16\n")
    table = load_gemm_table(str(tmp_path / "mine.yaml"))
    assert table.efficiency(4096, 4096, 4096) == pytest.approx(200 / 250)
    gpu = load_gpu({"name": "my-gpu", "memory_GiB": 24, "memory_bandwidth_GBps": 1000,
                    "peak_tflops": {"bf16": 250}, "gemm_table": str(tmp_path / "mine.yaml")})
    t = gemm_time(Device.of(gpu, "bf16"), 4096, 4096, 4096)
    assert t == pytest.approx(2 * 4096**3 / 200e12)
    (tmp_path / "bad.yaml").write_text("name: bad\nreference_peak_tflops: 250\ncsv: none.csv\n"
                                       "dtype: x\n")
    with pytest.raises(SpecError, match="not found"):
        load_gemm_table(str(tmp_path / "bad.yaml"))


def test_user_gemm_table_with_holes_is_a_spec_error(tmp_path):
    from paraplan.specs import SpecError
    from paraplan.specs.loaders import load_gemm_table

    (tmp_path / "t.csv").write_text("b,m,n,k,dtype,tflops\n1,1024,1024,1024,x,10\n"
                                    "1,2048,2048,2048,x,20\n")
    (tmp_path / "t.yaml").write_text("name: t\nreference_peak_tflops: 100\ncsv: t.csv\ndtype: x\n")
    with pytest.raises(SpecError, match="full m x n x k grid"):
        load_gemm_table(str(tmp_path / "t.yaml"))


def _tiny_moe() -> ModelSpec:
    return ModelSpec(name="tiny-moe", num_layers=2, hidden_size=256, num_attention_heads=4,
                     ffn_hidden_size=1024, vocab_size=1000, num_experts=4, moe_top_k=2)


def test_moe_permute_traffic_by_hand():
    from paraplan.simulator.moe import permute_elements_per_token

    model = _tiny_moe()  # h = 256, k = 2
    fused = permute_elements_per_token(model, ParallelPlan(), eager=False)
    assert fused == 2 * 256 + 2 * 2 * 256  # permute h -> kh, unpermute kh -> h
    eager = permute_elements_per_token(model, ParallelPlan(), eager=True)
    assert eager == 11 * 2 * 256 + 2 * 256  # five k-copy passes + scatter-add into zeros
    padded = permute_elements_per_token(model, ParallelPlan(ep=2, moe_capacity_factor=2.0),
                                        eager=True)
    assert padded == eager + 2 * 2.0 * 2 * 256  # two zero-filled capacity buffers


def test_eager_gradient_accumulation_pass_by_hand():
    from paraplan.simulator.grads import grad_accumulation_time

    model = load_model("gpt3-125m")
    dev = Device(matmul_flops=1e12, memory_Bps=1e10)
    eager = TrainingSpec(global_batch_size=8, seq_len=128, precision="fp32", kernels="eager")
    # read the buffer and the new gradient, write the sum: 3 x 4 bytes per parameter.
    want = 3 * 4 * model.dense_layer_params / 2 / 1e10
    got = grad_accumulation_time(model, eager, ParallelPlan(tp=2), dev, moe=False)
    assert got == pytest.approx(want, rel=1e-12)
    fused = eager.model_copy(update={"kernels": "fused"})
    assert grad_accumulation_time(model, fused, ParallelPlan(tp=2), dev, moe=False) == 0.0
    assert grad_accumulation_time(model, eager, ParallelPlan(zero_stage=2), dev,
                                  moe=False) == 0.0


def test_collective_efficiency_scales_only_its_kind():
    base = load_cluster("dgx-h100", nodes=2)
    slow = base.model_copy(update={"collective_efficiency": {"reduce_scatter": 0.5,
                                                             "p2p": 2.0}})
    t0, t1 = base.topology, slow.topology
    group = list(range(8))
    for kind in ("all_reduce", "all_gather"):
        assert coll.group_collective(t1, group, kind, 1e9) == \
            coll.group_collective(t0, group, kind, 1e9)
    ring = t0.ring(group)
    bw, lat = ring.bandwidth_GBps * 1e9, ring.latency_s
    assert coll.group_collective(t1, group, "reduce_scatter", 1e9) == pytest.approx(
        coll.ring_reduce_scatter(1e9, 8, 0.5 * bw, lat))
    pair = t0.pair(0, 8)
    assert coll.pipeline_p2p(t1, 8, 2, 8, 1e8) == pytest.approx(  # GPU 0 -> GPU 8
        coll.p2p(1e8, 2.0 * pair.bandwidth_GBps * 1e9, pair.latency_s))


MODEL_8B = load_model("llama3-8b")


def test_zero1_grad_sync_is_a_ring_reduce_scatter_plus_a_ring_all_gather():
    """ZeRO-1/2 reduce-scatter the gradients and all-gather the parameters bucket by bucket,
    each a ring: (n - 1) latency steps and (n - 1) / n of the bytes at the ring's bandwidth
    times the library's speed on that kind (NCCL has no tree for either). DDP all-reduces
    (its tree and node hierarchy help it)."""
    from paraplan.simulator.step import bucketed_grad_sync

    cluster = load_cluster("dgx-h100", nodes=2)
    topo, group = cluster.topology, tuple(range(16))
    training = TrainingSpec(global_batch_size=64, seq_len=2048)  # bf16, fp32 grad reduce
    count = 1e9
    ddp = bucketed_grad_sync(topo, group, MODEL_8B, ParallelPlan(), training, count)
    zero1 = bucketed_grad_sync(topo, group, MODEL_8B, ParallelPlan(zero_stage=1), training,
                               count)
    buckets = count / 40e6
    ring = topo.ring(group)
    bw, lat, n = ring.bandwidth_GBps * 1e9, ring.latency_s, 16

    def ring_pass(nbytes: float, eff: float = 1.0) -> float:  # one bucket, by hand
        return (n - 1) * lat + (n - 1) / n * nbytes / (bw * eff)

    g = training.grad_reduce_bytes
    assert ddp == pytest.approx(
        buckets * coll.group_collective(topo, group, "all_reduce", count * g / buckets))
    assert zero1 == pytest.approx(buckets * (ring_pass(count * g / buckets)
                                             + ring_pass(count * 2 / buckets)))
    gloo_like = cluster.model_copy(update={"collective_efficiency": {"reduce_scatter": 0.25}})
    slow = bucketed_grad_sync(gloo_like.topology, group, MODEL_8B, ParallelPlan(zero_stage=1),
                              training, count)
    assert slow == pytest.approx(buckets * (ring_pass(count * g / buckets, 0.25)
                                            + ring_pass(count * 2 / buckets)))
    # Over 512 GPUs the ring's 511 latency steps cost what the all-reduce's tree avoids.
    big = load_cluster("dgx-h100", nodes=64).topology
    every = tuple(range(512))
    one_bucket = bucketed_grad_sync(big, every, MODEL_8B, ParallelPlan(zero_stage=1),
                                    training, 40e6)
    assert one_bucket > 2 * 511 * big.ring(every).latency_s


@pytest.mark.parametrize("sp", [0, 1])
def test_head_tp_collectives_by_hand(sp):
    """Embedding, LM head and vocab-parallel cross entropy collectives of one micro-batch:
    llama3-8b, b=1, s=4096, bf16, tp=8 on one DGX H100 (NVLink ring: 369 GB/s, 5 us).
    act = 4096 * 4096 * 2 B = 33,554,432 B; ring all-reduce = 2*7*5 us + 1.75 * act / B
    = 70 + 159.13 = 229.13 us (SP: all-gather + reduce-scatter, the same sum); the loss's
    3 all-reduces of 4096 fp32 values cost 3 * (70 + 0.08) = 210.23 us. Forward pays the
    embedding's collective and the loss's three (439.37 us), backward the LM head's."""
    from paraplan.simulator.loss import lm_head_times
    from paraplan.simulator.step import head_times

    cluster = load_cluster("dgx-h100", nodes=1)
    model, training = load_model("llama3-8b"), TrainingSpec(global_batch_size=8, seq_len=4096)
    plan = parse_plan(f"tp=8,mbs=1,sp={sp}")
    dev = Device.of(cluster.gpu, training.precision, training.kernels)
    head = head_times(model, cluster.topology, training, plan, dev)
    f, b = lm_head_times(model, training, plan, dev)
    assert head.fwd - f == pytest.approx(439.37e-6, rel=1e-4)
    assert head.bwd - b == pytest.approx(229.13e-6, rel=1e-4)
    assert head.tp == pytest.approx(668.50e-6, rel=1e-4)
    one = head_times(model, cluster.topology, training, parse_plan("tp=1,mbs=1"), dev)
    assert (one.fwd, one.bwd, one.tp) == (*lm_head_times(model, training, parse_plan(
        "tp=1,mbs=1"), dev), 0.0)


def test_simulate_charges_head_tp_collectives_to_the_last_stage():
    from paraplan.simulator.step import head_times, layer_cost, simulate

    cluster = load_cluster("dgx-h100", nodes=1)
    model, training = load_model("llama3-8b"), TrainingSpec(global_batch_size=8, seq_len=4096)
    plan = parse_plan("tp=8,mbs=1,sp=1")
    dev = Device.of(cluster.gpu, training.precision, training.kernels)
    layer = layer_cost(model, cluster.topology, training, plan, dev, moe=False)
    head = head_times(model, cluster.topology, training, plan, dev)
    rep = simulate(model, cluster, training, plan)
    m = 8  # micro-batches: 8 sequences, dp = 1, mbs = 1
    assert rep.time_s["tp_comm"] == pytest.approx(m * (32 * layer.tp + head.tp), rel=1e-12)


def test_layer_checkpointing_is_half_full_recompute():
    """torchtitan's layer-level checkpointing (selective_ac_option "2", ``rc=layer``)
    recomputes every other layer whole: per layer, the mean of no recompute and full
    recompute in time, activation memory and hardware FLOPs."""
    from paraplan.simulator.flops import hardware_flops_per_step
    from paraplan.simulator.layer import compose_layer_cost, layer_parts
    from paraplan.simulator.memory import layer_activation_bytes

    cluster = load_cluster("dgx-h100", nodes=1)
    model, training = load_model("llama3-8b"), TrainingSpec(global_batch_size=8, seq_len=8192)
    plan = parse_plan("tp=2,sp=1,mbs=1")
    dev = Device.of(cluster.gpu, "bf16")
    parts = layer_parts(model, cluster.topology, training, plan, dev, moe=False)
    cost = {rc: compose_layer_cost(parts, rc) for rc in ("none", "full", "layer")}
    for field in ("fwd", "bwd", "tp"):
        assert getattr(cost["layer"], field) == pytest.approx(
            (getattr(cost["none"], field) + getattr(cost["full"], field)) / 2, rel=1e-12)
    mem = {rc: layer_activation_bytes(model, training, plan, 1, moe=False, recompute=rc)
           for rc in ("none", "full", "layer")}
    assert mem["layer"] == pytest.approx((mem["none"] + mem["full"]) / 2, rel=1e-12)
    hw = {rc: hardware_flops_per_step(model, 8, 8192, recompute=rc)
          for rc in ("none", "full", "layer")}
    assert hw["layer"] == pytest.approx((hw["none"] + hw["full"]) / 2, rel=1e-12)


def test_op_level_sac_reruns_the_tensor_parallel_all_gathers():
    """torchtitan's op-level SAC saves reduce-scatter outputs but not all-gathers, so the
    backward's recompute gathers attention's and the MLP's inputs again: one all-reduce's
    worth of TP traffic more per layer than no recomputation (by hand from the layer's
    parts), none at tp=1; the compute re-run is every second matmul (``selective_ac``) and the
    memory-bound ops."""
    from paraplan.simulator.layer import compose_layer_cost, layer_parts

    cluster = load_cluster("dgx-h100", nodes=1)
    model, training = load_model("llama3-8b"), TrainingSpec(global_batch_size=8, seq_len=8192)
    dev = Device.of(cluster.gpu, "bf16")
    parts = layer_parts(model, cluster.topology, training, parse_plan("tp=8,sp=1,mbs=1"), dev,
                        moe=False)
    none, op = compose_layer_cost(parts, "none"), compose_layer_cost(parts, "op")
    assert parts.tp_s > 0
    assert op.tp == pytest.approx(none.tp + parts.tp_s, rel=1e-12)
    lt = parts.times
    assert op.bwd == pytest.approx(none.bwd + parts.tp_s + lt.op_rerun_gemm_s
                                   + lt.elementwise_fwd_s, rel=1e-12)
    assert 0.3 * lt.gemm_fwd_s < lt.op_rerun_gemm_s < 0.45 * lt.gemm_fwd_s  # wk, wo, w3
    one = layer_parts(model, cluster.topology, training, parse_plan("tp=1,mbs=1"), dev,
                      moe=False)
    assert compose_layer_cost(one, "op").tp == 0.0


def test_current_fp8_scaling_rereads_the_input():
    """Per-tensor current scaling needs the tensor's amax before its cast, so the cast re-reads
    the 16-bit input: 2 B per element on top of the fused cast's 2 B written (row- and
    column-wise fp8); delayed scaling keeps the cast in the producer; block scaling (MXFP8)
    quantizes in a kernel of its own that reads the 16-bit input and writes both copies with
    a scale per 32 elements each (2 + 2 + 2/32 B). torchtitan's float8 is dynamic (current),
    Megatron-Core's default recipe delayed; NVIDIA's rows name theirs."""
    from paraplan.specs import load_gpu
    from paraplan.specs.loaders import load_trainer
    from paraplan.specs.trainer import trainer_training
    from paraplan.validate.published import load_published_throughput

    h100 = load_gpu("h100-sxm")
    delayed = Device.of(h100, "fp8")
    current = Device.of(h100, "fp8", scaling="current")
    block = Device.of(h100, "fp8", scaling="block")
    assert (delayed.fp8_cast_bytes, current.fp8_cast_bytes, block.fp8_cast_bytes) == \
        (2, 4, 4.0625)
    assert Device.of(h100, "bf16", scaling="current").fp8_cast_bytes == 0
    m, n, k = 8192, 4096, 4096
    assert gemm_time(current, m, n, k) - gemm_time(delayed, m, n, k) == pytest.approx(
        2.0 * (m * k + k * n) / delayed.memory_Bps, rel=1e-9)
    fp8 = TrainingSpec(global_batch_size=8, seq_len=4096, precision="fp8")
    assert trainer_training(load_trainer("torchtitan"), fp8).fp8_scaling == "current"
    assert trainer_training(load_trainer("megatron-core"), fp8).fp8_scaling == "delayed"
    rows = {c.index: c for c in load_published_throughput(None)}
    assert rows[323].training.fp8_scaling == "current"  # H100, "FP8 current scaling"
    assert rows[327].training.fp8_scaling == "block"  # B200, "MXFP8"


@pytest.mark.parametrize(("optimizer", "master", "moments", "expected"), [
    ("adam", "fp32", "fp32", 12),  # ZeRO paper sec 3.1: K = 12
    ("adam", "fp32", "bf16", 8),   # DeepSeek-V3 sec 3.3.3: BF16 moments, fp32 master
    ("adam", "bf16", "bf16", 6),   # apex DistributedFusedAdam dtype=bf16: copy + 2 moments
    ("sgd_momentum", "fp32", "bf16", 6),
    ("sgd", "bf16", "bf16", 2),
    ("adam", "remainder", "fp32", 10),  # NeMo: bf16 params + 16-bit remainders
])
def test_optimizer_state_bytes_follow_its_dtypes(optimizer, master, moments, expected):
    t = TrainingSpec(global_batch_size=8, seq_len=128, optimizer=optimizer,
                     master_weights_dtype=master, moments_dtype=moments)
    assert t.optimizer_state_bytes_per_param == expected


def test_userbuffers_tp_overlap_charges_the_sms_its_comm_kernels_hold():
    # TE userbuffers (initialize_ub defaults): the pipelined reduce-scatter GEMMs (O-proj,
    # FC2 forward) and the bulk-overlapped data gradients (QKV, FC1) run on sm - 16 SMs;
    # the ring-exchange GEMMs lose nothing. Hand-worked for Llama-3-8B, tp=2, mbs=1, 4K.
    from paraplan.simulator.tp_overlap import tp_overlap_split_time

    model, gpu = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=1).gpu
    training = TrainingSpec(global_batch_size=8, seq_len=4096)
    dev = Device.of(gpu, "bf16")
    plan = parse_plan("tp=2,sp=1,mbs=1").model_copy(update={"tp_comm_overlap": True})
    m, h, ffn = 4096, 4096, 14336 / 2
    q_kv = (32 + 2 * 8) * 128 / 2  # QKV columns per rank (GQA: 8 KV heads)
    o_k = 32 * 128 / 2
    slower = 16 / (132 - 16)
    fwd, bwd = tp_overlap_split_time(model, training, plan, dev, moe=False)
    assert fwd == pytest.approx(slower * (gemm_time(dev, m, h, o_k) + gemm_time(dev, m, h, ffn)))
    assert bwd == pytest.approx(slower * (gemm_time(dev, m, h, q_kv)
                                          + gemm_time(dev, m, h, 2 * ffn)))
    # Nothing without the overlap, and PyTorch's async TP is priced by the NCCL-SM rule.
    assert tp_overlap_split_time(model, training, plan.model_copy(
        update={"tp_comm_overlap": False}), dev, moe=False) == (0.0, 0.0)
    async_tp = training.model_copy(update={"tp_overlap": "async_tp"})
    assert tp_overlap_split_time(model, async_tp, plan, dev, moe=False) == (0.0, 0.0)


def test_gemm_table_k_extrapolation_never_runs_backwards():
    # A launch-bound shape whose rate grows faster than k (time falls with k) keeps the rate
    # of the longest measured k instead of extrapolating towards zero or negative time.
    from paraplan.specs.cluster import GemmTable

    t = GemmTable(name="x", reference_peak_tflops=10, m=[256], n=[256], k=[1024, 2048],
                  tflops=[1.0, 4.0])
    for k in (3072, 1e5, 1e9):
        assert t.efficiency(256, 256, k) == pytest.approx(0.4)


def test_fsdp_keeps_gradient_shards_in_the_master_dtype_whatever_it_reduces_in():
    """PyTorch FSDP casts each reduced gradient shard back to the shard's own dtype, the fp32
    master (FSDP1 _cast_grad_to_param_dtype, FSDP2 foreach_reduce), so reducing in bf16
    (composer's PURE) halves the traffic but not the gradient memory: 4 B per sharded
    parameter either way, by hand; a trainer without FSDP keeps its bf16 buffer (2 B)."""
    from paraplan.simulator.step import simulate

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=1)
    plan = parse_plan("zero=3,mbs=1,rc=full")
    grads = {}
    for fsdp in ("flat", None):
        for fp32 in (True, False):
            training = TrainingSpec(global_batch_size=8, seq_len=2048, grad_reduce_fp32=fp32,
                                    fsdp_copies=fsdp)
            report = simulate(model, cluster, training, plan)
            grads[(fsdp, fp32)] = report.memory_gb["grads"]
    per_rank = model.num_params / 8 / 2**30
    assert grads[("flat", True)] == grads[("flat", False)] == pytest.approx(4 * per_rank,
                                                                            rel=0.02)
    assert grads[(None, False)] == pytest.approx(2 * per_rank, rel=0.02)
    assert TrainingSpec(global_batch_size=8, seq_len=2048, fsdp_copies="per_param",
                        master_weights_dtype="bf16").sharded_grad_bytes == 2


@pytest.mark.parametrize("update,want", [
    # Megatron-Core, bf16 grad buffer: fused Adam 24 + 4, the norm 4, the fp32 gradient copy
    # (read 2, write 4) and the master -> bf16 parameter copy (read 4, write 2).
    ({}, 24 + 4 + 4 + 6 + 6),
    ({"grad_reduce_fp32": True}, 24 + 4 + 4 + 0 + 6),   # fp32 buffer: .float() copies nothing
    # torchtitan's FSDP2 with fused AdamW: fp32 shards in place, the norm and the scale.
    ({"fsdp_copies": "per_param", "grad_reduce_fp32": True, "clip_scales_always": True},
     24 + 4 + 4 + 8),
    # ... with foreach AdamW (2024): 20 fp32 accesses instead of 7.
    ({"fsdp_copies": "per_param", "grad_reduce_fp32": True, "clip_scales_always": True,
      "optimizer_impl": "foreach"}, 20 * 4 + 4 + 8),
    # Composer's DecoupledAdamW loop under FSDP1 with a bf16 reduction: the shard is fp32.
    ({"fsdp_copies": "flat", "clip_scales_always": True, "optimizer_impl": "for_loop"},
     20 * 4 + 4 + 8),
    # fp16 with loss scaling: the fp32 gradients are unscaled in place first.
    ({"precision": "fp16"}, 24 + 4 + 4 + 6 + 6 + 8),
    # Megatron's precision-aware optimizer with bf16 moments: its kernel reads the bf16 grad
    # buffer and writes the bf16 parameter itself.
    ({"moments_dtype": "bf16"}, 2 * 8 + 2 + 2 + 2),
])
def test_optimizer_step_bytes_by_implementation(update, want):
    from paraplan.simulator.grads import optimizer_bytes_per_param

    training = TrainingSpec(global_batch_size=8, seq_len=1024).model_copy(update=update)
    assert optimizer_bytes_per_param(training) == want


def test_optimizer_step_priced_on_the_shard_and_from_the_trainer():
    # The step grows by the extra bytes x parameters on the rank (zero 3: 1/8 of them) /
    # bandwidth when only the implementation changes; the trainer profiles carry it.
    from paraplan import simulate
    from paraplan.simulator.memory import params_per_stage
    from paraplan.specs import load_trainer

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    training = TrainingSpec(global_batch_size=64, seq_len=4096, fsdp_copies="per_param",
                            grad_reduce_fp32=True)
    plan = parse_plan("tp=1,pp=1,dp=8,zero=3,mbs=2")
    fused = simulate(model, cluster, training, plan)
    loop = simulate(model, cluster, training.model_copy(update={"optimizer_impl": "for_loop"}),
                    plan)
    dense, experts = params_per_stage(model, plan, [model.num_layers], 0, [0])
    dev = Device.of(cluster.node_groups[0].gpu, "bf16")
    want = 13 * 4 * (dense + experts) / 8 / dev.memory_Bps
    assert loop.time_s["optimizer"] - fused.time_s["optimizer"] == pytest.approx(want)
    assert loop.step_time_s - fused.step_time_s == pytest.approx(want)
    assert load_trainer("llm-foundry").runs.optimizer_impl == "for_loop"
    assert load_trainer("torchtitan").runs.clip_scales_always
    assert not load_trainer("megatron-core").runs.clip_scales_always


def test_b200_attention_runs_at_the_measured_in_step_rate():
    """stas00 (ml-engineering @744d01e1) measured FlashAttention-4 inside a Llama-3.1-8B step
    on B200 at 834 TFLOP/s of causal model FLOPs, forward and backward together; the profile
    gives that back at 8k tokens and d = 128 (backward 2.5x the forward's FLOPs), and GB200
    1.025x it (NVIDIA's same-recipe A/Bs)."""
    from paraplan.specs import load_gpu

    for name, want in (("b200", 834.0), ("gb200", 834.0 * 1.025)):
        dev = Device.of(load_gpu(name), "bf16")
        combined = 3.5 / (1.0 / dev.attention_fwd_flops + 2.5 / dev.attention_bwd_flops)
        assert combined / 1e12 == pytest.approx(want, rel=2e-3)


def test_a100_flash_attention_runs_at_the_measured_causal_rate():
    """zhuzilin/ring-flash-attention's A100 row (flash_attn_kvpacked_func, bf16, batch 1, 8192
    tokens, 32 heads of 128, causal): 373.4 forwards/s and 94.7 forward+backwards/s. The
    profiles give back 205.3 TFLOP/s forward and, for the backward by difference at 2.5x the
    forward FLOPs, 174.4 TFLOP/s at the burst clock (the profile's sustained clock on top)."""
    from paraplan.specs import load_gpu

    flops = 4 * 8192**2 * 32 * 128 / 2
    fwd_s, both_s = 1 / 373.4, 1 / 94.7
    for name in ("a100-sxm-80gb", "a100-sxm-40gb"):
        gpu = load_gpu(name)
        dev = Device.of(gpu, "bf16")
        clock = gpu.sustained_clock_fraction
        assert dev.attention_fwd_flops / clock / 1e12 == pytest.approx(flops / fwd_s / 1e12,
                                                                         rel=2e-3)
        assert dev.attention_bwd_flops / clock / 1e12 == pytest.approx(
            2.5 * flops / (both_s - fwd_s) / 1e12, rel=2e-3)


def test_triton_flash_attention_is_fa1_class_only_in_its_backward():
    """Dao 2023 sec. 4.1 (A100): FlashAttention-2 is "around 1.3-1.5x faster than FlashAttention
    in Triton in the forward pass and around 2x faster in the backward pass", against 1.7-3.0x
    over the CUDA FlashAttention: llm-foundry's attn_impl triton prices its forward at 1.4x and
    its backward at 2x FlashAttention-2's time, flash-attn 1.x both at 2x."""
    from paraplan.simulator.compute import attention_times
    from paraplan.specs import load_trainer

    model = load_model("mpt-7b")
    dev = Device.of(load_cluster("dgx-a100-80gb").gpu, "bf16")
    plan = parse_plan("tp=1,pp=1,dp=8,zero=3,mbs=2")
    fa2 = TrainingSpec(global_batch_size=16, seq_len=8192)
    _, f2, b2 = attention_times(model, fa2, plan, dev)
    _, f1, b1 = attention_times(model, fa2.model_copy(update={"flash_attention_version": 1}),
                                plan, dev)
    _, ft, bt = attention_times(model, fa2.model_copy(update={
        "flash_attention_version": 1, "flash_attention_triton": True}), plan, dev)
    assert (f1 / f2, b1 / b2) == (pytest.approx(2.0), pytest.approx(2.0))
    assert (ft / f2, bt / b2) == (pytest.approx(1.4), pytest.approx(2.0))
    _, f2t, _ = attention_times(model, fa2.model_copy(update={"flash_attention_triton": True}),
                                plan, dev)
    assert f2t == f2  # the flag describes a FlashAttention-1-class kernel only
    runs = load_trainer("llm-foundry").runs
    assert runs.flash_attention_version == 1 and runs.flash_attention_triton


def test_fa1_class_kernels_run_narrow_heads_as_fast_as_wide_ones():
    """FlashAttention-2's A100 benchmark (Dao 2023 Fig. 4, causal fwd + bwd at 16k tokens):
    FlashAttention-2 reaches 171 TFLOP/s at d = 64 against 189 at d = 128 (0.90, the head
    factor), the Triton kernel 80 and 80, flash-attn 1.x 97 and 83. So at one model width
    (heads x d fixed), a 64-wide-head model's attention takes the 128-wide one's time under a
    1.x kernel and 1/0.88-1/0.89 of it under FlashAttention-2."""
    from paraplan.simulator.attention_shape import attention_shape_factors
    from paraplan.simulator.compute import attention_times

    dev = Device.of(load_cluster("dgx-a100-80gb").gpu, "bf16")
    plan = parse_plan("tp=1,pp=1,dp=8,zero=3,mbs=1")
    wide = load_model("mpt-7b")  # 4096 wide, 32 heads of 128
    narrow = wide.model_copy(update={"num_attention_heads": 64, "num_kv_heads": 64})
    assert narrow.attention.qk_head == 64 and wide.attention.qk_head == 128
    for version, triton in ((1, True), (1, False), (2, False)):
        training = TrainingSpec(global_batch_size=8, seq_len=16384,
                                flash_attention_version=version, flash_attention_triton=triton)
        _, fw, bw = attention_times(wide, training, plan, dev)
        _, fn, bn = attention_times(narrow, training, plan, dev)
        if version == 1:
            assert (fn / fw, bn / bw) == (pytest.approx(1.0), pytest.approx(1.0))
        else:
            hf, hb = attention_shape_factors(16384, 64)
            assert (fn / fw, bn / bw) == (pytest.approx(1 / hf), pytest.approx(1 / hb))
            assert 1 / hf == pytest.approx(189 / 171, rel=0.03)
    assert attention_shape_factors(2048, 64, narrow_head_penalty=False) == \
        attention_shape_factors(2048, 128)


@pytest.mark.parametrize("name", ["sm_90", "sm_100"])
def test_measured_gemm_throughput_follows_the_output_area_not_its_shape(name):
    # What ``GemmTable._fold`` rests on, read from the measured tables themselves: at one k,
    # outputs of the same m x n (at least 2^21 elements) run within 3% of each other whatever
    # their aspect ratio (bf16; fp8 on sm_100 has one 10% outlier at k = 2048).
    import csv
    from pathlib import Path

    import paraplan.hardware_profiles as profiles
    from paraplan.specs.loaders import load_gemm_table

    table = load_gemm_table(name)
    with open(Path(profiles.__file__).parent / "gemm" / f"{name}.csv", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["b"] == "1" and r["dtype"].startswith("bf16")]
    tflops = {(int(r["m"]), int(r["n"]), int(r["k"])): float(r["tflops"]) for r in rows}
    for k in (2048, 4096):
        for area in (2**21, 2**22, 2**23):
            same = [v for (m, n, kk), v in tflops.items() if kk == k and m * n == area]
            assert len(same) >= 2 and max(same) / min(same) < 1.03
    assert table.efficiency(2048, 9216, 4096) > table.efficiency(2048, 4096, 4096)


@given(m=st.floats(1, 1e5), n=st.floats(1, 1e5), k=st.sampled_from([512, 2048, 4096, 12288]))
@settings(max_examples=60, deadline=None)
def test_gemm_table_fold_keeps_the_output_area(m, n, k):
    # An output dimension beyond the grid folds into the other one at the same m x n while
    # that one has room; the lookup stays within (0, the table's fastest shape].
    from paraplan.specs.loaders import load_gemm_table

    table = load_gemm_table("sm_90")
    m_max, n_max = table.m[-1], table.n[-1]
    fm, fn = table._fold(m, n)
    if n > n_max and m * n / n_max <= m_max:
        assert (fm, fn) == (pytest.approx(m * n / n_max), n_max)
    elif m > m_max and m * n / m_max <= n_max:
        assert (fm, fn) == (m_max, pytest.approx(m * n / m_max))
    elif m <= m_max and n <= n_max:
        assert (fm, fn) == (m, n)
    assert table.efficiency(m, n, k) == table.efficiency(fm, fn, k)
    assert 0.0 < table.efficiency(m, n, k) <= table.best_tflops / table.reference_peak_tflops
