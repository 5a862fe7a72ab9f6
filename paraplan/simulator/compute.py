"""Time of forward/backward passes on one GPU: a per-op roofline.

GEMMs run at ``max(flops / (peak * matmul_efficiency), bytes / effective_bandwidth)`` plus a
per-kernel overhead, so small or skinny GEMMs become memory- or launch-bound on their own
(Williams et al. 2009, "Roofline"). Fused attention runs at a fraction of the GEMM efficiency
(FlashAttention-2, Dao 2023, sec 4.1: 73% of peak forward and 63% backward on A100 versus ~87%
for cuBLAS GEMMs, i.e. 0.84x and 0.72x), less on short calls and narrow heads
(``attention_shape``, measured). Norms, activations, residual adds, rotary embeddings, softmax
(without flash) and the optimizer step are memory-bound and run at the achievable memory
bandwidth. One set of parameters per GPU profile; nothing is fitted per run. Seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from paraplan.simulator import moe as routing
from paraplan.simulator.attention_shape import attention_shape_factors
from paraplan.simulator.copies import (
    eager_ring_bytes,
    kv_repeat_bytes,
    qkv_cat_bytes,
    unpad_bytes,
)
from paraplan.simulator.variability import slowest_part_pace
from paraplan.specs.attention import attended_keys
from paraplan.specs.cluster import GemmTable, GPUSpec
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

# FlashAttention-2's causal forward / backward against the best GEMM, both measured on A100
# (the a100 profiles' attention_efficiency_fwd/_bwd over their matmul_efficiency), for GPUs
# whose profile has no attention figure of its own.
FLASH_FWD_RELATIVE = 0.658 / 0.869
FLASH_BWD_RELATIVE = 0.559 / 0.869
# FlashAttention-1-class kernels' (forward, backward) time against FlashAttention-2's at d = 128:
# the CUDA flash-attn 1.x about twice (Dao 2023: "2x speedup"; its Fig. 4, fwd+bwd, 2.15-2.28x
# at >= 1k tokens), the Triton one "around 1.3-1.5x" in the forward (1.4) and "around 2x" in
# the backward (sec. 4.1, A100; Fig. 4's 2.2-2.4x would leave MPT's long rows ~20% too slow).
FA1_SLOWDOWN = {"cuda": (2.0, 2.0), "triton": (1.4, 2.0)}
KERNEL_OVERHEAD_S = 2e-6  # per-kernel ramp-up/tail and launch gap on a busy stream
# cuBLAS/CUTLASS output tiles for large bf16 GEMMs on Ampere/Hopper; one per SM per wave, so a
# partial last wave idles SMs (NVIDIA DL Performance Guide, Matrix Multiplication Background).
GEMM_TILES = ((128, 256), (256, 128), (128, 128))
# SMs NCCL kernels occupy while a collective overlaps compute (one block per channel; 16 for
# NVLink/IB rings, else ``GPUSpec.nccl_channels``): a collective of C seconds under compute
# takes C * channels / sm_count of its SM-time (Calculon: compute "stolen" by collectives).
NCCL_SMS = 16
# Bytes written per GEMM input element by a fused fp8 cast (Transformer Engine's
# cast_transpose, torch.compile'd torchao): the row-wise fp8 copy for the forward GEMM and the
# column-wise (transposed) one the weight-gradient GEMM needs, 1 B each. Hopper's fp8 tensor
# cores take only the TN layout, so every fp8 operand used in both passes is stored both ways
# (TE transformer_engine/common/transpose/cast_transpose.cu; TE Float8Tensor rowwise and
# columnwise data). The 16-bit read belongs to the producing op (fused into it).
FP8_FUSED_CAST_BYTES = 2.0
# Current (per-tensor, just-in-time) scaling needs the whole tensor's amax before its cast, so
# the cast cannot live in the producing kernel: it re-reads the 16-bit tensor (2 B) after
# the reduction (TE Float8CurrentScalingQuantizer: amax "computed directly by scanning the
# input high-precision tensor"; torchtitan float8.md: "the overhead of dynamic quantization").
FP8_CURRENT_SCALING_REREAD_BYTES = 2.0
# Block scaling (MXFP8's 1x32 E8M0 blocks, Megatron ``--fp8-recipe mxfp8``; DeepSeek-style
# 1x128 blocks, ``blockwise``) quantizes in a kernel of its own, outside the producing op:
# Transformer Engine's ``mxfp8::quantize`` (common/cast/mxfp8/quantize_mxfp8.cuh,
# BIDIMENSIONAL, TE d0067d0) reads the 16-bit tensor once (2 B) and writes the row- and
# column-wise fp8 copies with a scale per 32 elements each (2/32 B); it fuses into the norm
# only through cuDNN's norm, which Megatron-Bridge's MXFP8 recipes leave off
# (NVTE_NORM_FWD_USE_CUDNN is set in its FP8 current-scaling Llama recipes only). NVIDIA's own
# same-layout pairs run MXFP8 7.5-11.8% slower than FP8 current scaling (Megatron-Bridge
# docs/performance-summary: Llama 3.1 405B on 256 GB300, 1024 vs 949 tokens/s/GPU; Llama 3 70B
# SFT on 32 GB200 / GB300), more than these bytes explain.
FP8_BLOCK_QUANTIZE_EXTRA_BYTES = 2.0 + 2.0 / 32
KERNELS_PER_LAYER_FWD = 12  # norms, QKV, rope, attention, proj, adds, MLP matmuls, activation


@dataclass(frozen=True)
class Device:
    """What the roofline needs from a GPU for one precision (FLOP/s and bytes/s)."""

    matmul_flops: float
    """Achievable dense GEMM throughput, FLOP/s (peak * matmul_efficiency, at the sustained
    clock and the job's slowest part's pace)."""
    memory_Bps: float
    """Achievable memory bandwidth, bytes/s (peak * memory_bandwidth_efficiency)."""
    sm_count: int | None = None
    """SMs for wave quantization; None disables it."""
    attention_fwd_flops: float = 0.0
    """Achievable fused-attention forward throughput, FLOP/s (``Device.of`` sets it)."""
    attention_bwd_flops: float = 0.0
    """Achievable fused-attention backward throughput, FLOP/s."""
    peak_flops: float = 0.0
    """Dense peak of the GEMM dtype, FLOP/s (scales a measured GEMM table to this part)."""
    gemm_table: GemmTable | None = None
    """Measured GEMM throughput by shape; replaces roofline + wave quantization."""
    table_scale: float = 1.0
    """Factor on the table's efficiency: this part's GEMM efficiency for the precision over the
    table's reference part's (``GemmTable.reference_matmul_efficiency``; without one, the fp8
    over the 16-bit efficiency where a 16-bit table prices fp8), times the clock fraction and
    the slowest part's pace (a table's small, memory- or launch-bound shapes carry both too)."""
    fp8_cast_bytes: float = 0.0
    """Bytes moved per GEMM input element to cast it to fp8 (0 when not training in fp8)."""
    fp8_weights_cached: bool = False
    """Weights are cast to fp8 once per step, not per GEMM call (``weight_cache``)."""
    fp8_input_read_bytes: float = 0.0
    """Bytes per input element a fused stack's fp8 cast reads when it cannot live in the
    producing kernel (``gemm_time``'s ``own_cast``): the 16-bit read, 2 B; 0 when not
    training in fp8, for eager casts (their 5 B already read the input) and for block
    scaling (its quantize kernel's read is in ``FP8_BLOCK_QUANTIZE_EXTRA_BYTES``)."""
    fp8_cast_launches: int = 0
    """Kernels each current-scaled fp8 cast launches beside the cast itself
    (``TrainingSpec.fp8_cast_kernels``), each at least ``KERNEL_OVERHEAD_S``."""
    nccl_sms: int = NCCL_SMS
    """SMs an overlapped NCCL collective occupies (``GPUSpec.nccl_channels``)."""
    moe_sync_stall_s: float = 0.0
    """GPU idle per MoE layer forward while the host catches up after its sync, s."""

    @classmethod
    def of(cls, gpu: GPUSpec, precision: str, kernels: str = "fused", *,
           weight_cache: bool = False, scaling: str = "delayed",
           cast_kernels: int = 0, synced_gpus: int = 1) -> Device:
        """The roofline's view of ``gpu`` training in ``precision`` with ``kernels`` (fused or
        eager non-GEMM ops); ``weight_cache``, ``scaling``, ``cast_kernels``: the fp8 recipe
        (``TrainingSpec``); ``synced_gpus``: GPUs (a count) every step synchronises, whose
        slowest sets GEMM and attention throughput (``variability``); 1 = this part alone."""
        peak = gpu.peak_flops(precision) if precision in gpu.peak_tflops else \
            gpu.peak_flops("fp16")
        eff = gpu.matmul_efficiency_fp8 if (precision == "fp8" and gpu.matmul_efficiency_fp8) \
            else gpu.matmul_efficiency
        # Burst efficiencies run at the clock the power limit sustains (sustained_clock_fraction)
        # and below a host's lower cap (power_fraction); a directly measured sustained GEMM
        # figure (sustained_matmul_efficiency) replaces burst x clock for GEMMs. A step synced
        # over ``synced_gpus`` parts computes at its slowest part's pace (``variability``).
        level = gpu.power_fraction * slowest_part_pace(gpu.unit_speed_spread, synced_gpus)
        clock = gpu.sustained_clock_fraction * level
        fp8 = precision == "fp8"
        sustained = gpu.sustained_matmul_efficiency
        if fp8 and sustained is not None:
            sustained = gpu.sustained_matmul_efficiency_fp8 or sustained * eff / \
                gpu.matmul_efficiency
        matmul = peak * (eff * clock if sustained is None else sustained * level)
        # Attention kernels run in 16-bit even in fp8 training.
        peak16 = max(gpu.peak_tflops.get("bf16", 0.0), gpu.peak_tflops.get("fp16", 0.0)) * 1e12
        peak16 = peak16 or peak
        fwd = peak16 * clock * (gpu.attention_efficiency_fwd
                                or gpu.matmul_efficiency * FLASH_FWD_RELATIVE)
        bwd = peak16 * clock * (gpu.attention_efficiency_bwd
                                or gpu.matmul_efficiency * FLASH_BWD_RELATIVE)
        cast = (5.0 if kernels == "eager" else FP8_FUSED_CAST_BYTES
                + FP8_CURRENT_SCALING_REREAD_BYTES * (scaling == "current")
                + FP8_BLOCK_QUANTIZE_EXTRA_BYTES * (scaling == "block")) if fp8 else 0.0
        # fp8 GEMMs read a measured fp8 table where the profile has one; else the 16-bit
        # table scaled by the large-GEMM fp8 / 16-bit efficiency ratio.
        table, scale = gpu.gemm_table, eff / gpu.matmul_efficiency * clock
        if fp8 and gpu.gemm_table_fp8 is not None:
            table, scale = gpu.gemm_table_fp8, clock
        own_fp8 = not fp8 or gpu.gemm_table_fp8 is None or gpu.matmul_efficiency_fp8
        if table is not None and table.reference_matmul_efficiency and own_fp8:
            # (An fp8 table on a part with no fp8 efficiency of its own keeps the rated-peak
            # scaling: its 16-bit efficiency says nothing about the fp8 reference's level.)
            # The table's shape profile at this part's own measured best-GEMM level: a GB200
            # reaches 1822 TFLOP/s where the reference B200 reaches 1745 (stas00 MAMF), 1.044x,
            # not the 1.111x of their rated peaks (2500 / 2250).
            scale = eff / table.reference_matmul_efficiency * clock
        if table is not None and sustained is not None:  # shape from the table, level measured
            scale = sustained * level / table.best_square_efficiency()
        return cls(matmul, gpu.memory_bandwidth_GBps * 1e9 * gpu.memory_bandwidth_efficiency,
                   gpu.sm_count, fwd, bwd, peak_flops=peak, gemm_table=table,
                   table_scale=scale, fp8_cast_bytes=cast, fp8_weights_cached=weight_cache and fp8,
                   fp8_input_read_bytes=2.0 if fp8 and kernels != "eager"
                   and scaling != "block" else 0.0,
                   fp8_cast_launches=cast_kernels if fp8 and scaling == "current" else 0,
                   nccl_sms=gpu.nccl_channels or NCCL_SMS)

    @classmethod
    def of_training(cls, gpu: GPUSpec, training: TrainingSpec, synced_gpus: int = 1) -> Device:
        """``Device.of`` with the precision, kernels, fp8 weight caching and MoE host stall
        (``TrainingSpec.moe_host_sync_s`` on this GPU's host) ``training`` runs, for a step
        synchronised over ``synced_gpus`` parts (the job's world size)."""
        return replace(cls.of(gpu, training.precision, training.kernels,
                              weight_cache=training.fp8_weight_cache,
                              scaling=training.fp8_scaling, cast_kernels=training.fp8_cast_kernels,
                              synced_gpus=synced_gpus),
                       moe_sync_stall_s=training.moe_host_sync_s * gpu.host_time_factor)

    @property
    def nccl_slowdown(self) -> float:
        """Fraction of compute lost while an NCCL collective runs alongside it."""
        return min(self.nccl_sms, self.sm_count) / self.sm_count if self.sm_count else 0.0


@lru_cache(maxsize=65536)
def wave_efficiency(m: float, n: float, sm_count: int | None) -> float:
    """Fraction of SM-time doing useful tiles for an m x n output (best of the usual tiles)."""
    if not sm_count:
        return 1.0
    best = 0.0
    for tm, tn in GEMM_TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        waves = math.ceil(tiles / sm_count)
        best = max(best, tiles / (waves * sm_count))
    return best


def gemm_time(device: Device, m: float, n: float, k: float, elem_bytes: float = 2.0, *,
              own_cast: bool = False) -> float:
    """Roofline time of one (m x k) @ (k x n) GEMM with wave quantization, seconds.
    ``own_cast``: in fp8, the m x k input is cast by a kernel of its own, which reads the
    16-bit tensor (``Device.fp8_input_read_bytes``), not inside the op that produced it."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2.0 * m * n * k
    if device.gemm_table is not None:
        # Measured throughput at this shape (launch, waves and memory effects included).
        eff = device.gemm_table.efficiency(m, n, k) * device.table_scale
        gemm = flops / (device.peak_flops * eff)
    else:
        traffic = elem_bytes * (m * k + k * n + m * n)
        compute = flops / (device.matmul_flops * wave_efficiency(m, n, device.sm_count))
        gemm = max(compute, traffic / device.memory_Bps) + KERNEL_OVERHEAD_S
    if device.fp8_cast_bytes:
        # Dynamic scaling casts both 16-bit inputs to fp8: eager (torchao tensorwise without
        # compile) runs amax (read 2 B) and cast (read 2 B, write 1 B) as separate kernels;
        # fused stacks (Transformer Engine, torch.compile) fold them into the producer and
        # only write the row- and column-wise fp8 copies (``FP8_FUSED_CAST_BYTES``). The
        # k x n operand is the weight in every call here; a trainer that caches the cast
        # weights (``fp8_weights_cached``) pays for them once per step, in
        # ``optimizer_step_time``.
        weights = 0.0 if device.fp8_weights_cached else k * n
        gemm += device.fp8_cast_bytes * (m * k + weights) / device.memory_Bps
        if own_cast:
            gemm += device.fp8_input_read_bytes * m * k / device.memory_Bps
        # Current scaling: each cast's own amax and scale kernels (``fp8_cast_launches``):
        # the forward casts the input (and the weight unless cached), the backward only
        # grad_output (the saved fp8 input serves the weight gradient). layer_times prices the
        # backward as twice the forward GEMMs, so each call carries a third of the three
        # passes' casts.
        casts = (1 if device.fp8_weights_cached else 2) + 1
        gemm += casts / 3 * device.fp8_cast_launches * KERNEL_OVERHEAD_S
    return gemm


@dataclass(frozen=True)
class LayerTimes:
    """Compute time of one layer for one micro-batch on one rank (no communication)."""

    forward_s: float
    backward_s: float
    """Input- plus weight-gradient time (2x the GEMMs), without recomputation."""
    gemm_fwd_s: float
    """GEMM part of forward_s; the weight-gradient pass of backward_s (the W pass of
    zero-bubble schedules) costs the same."""
    attention_fwd_s: float
    """Attention score/value part of forward_s (what selective recompute re-runs)."""
    elementwise_fwd_s: float = 0.0
    """Memory-bound part of forward_s (norms, activations, rotary, residual adds)."""
    expert_fwd_s: float = 0.0
    """Routed experts' GEMM part of gemm_fwd_s (MoE layers; 0 for dense ones): what runs
    between the dispatch and the combine all-to-all."""
    rerun_skip_s: float = 0.0
    """Part of forward_s a whole-layer recompute does not run again: the dense MLP's down
    projection where the checkpoint stops early (``TrainingSpec.recompute_early_stop``)."""
    op_rerun_gemm_s: float | None = None
    """GEMM seconds op-level selective checkpointing runs again (every second matmul:
    ``selective_ac.op_sac_matmuls``, else half of them); ``layer_terms.compose_times`` always
    sets it (None fails loudly where a layer's times were built some other way)."""


def dispatch_sort_time(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                       device: Device) -> float:
    """Forward seconds of one MoE layer's sort of the received rows by local expert and back
    (``moe.sort_elements_per_token``, memory-bound), one micro-batch, one rank. It reads the
    MoE dispatcher, so ``layer_times`` (which does not) leaves it to ``with_dispatch_sort``."""
    elems = routing.sort_elements_per_token(model, training, plan)
    if not elems:
        return 0.0
    return (routing.dispatch_tokens(training, plan) * elems * training.compute_bytes
            / device.memory_Bps)


def with_dispatch_sort(times: LayerTimes, sort_s: float) -> LayerTimes:
    """``times`` with the dispatcher's sort (``dispatch_sort_time``) added as memory-bound work,
    once forward and once backward: a permutation's gradient is the inverse permutation of
    the gradient rows, the same bytes (not the two passes other elementwise ops are priced
    at)."""
    if not isinstance(sort_s, np.ndarray) and not sort_s:  # (arrays: the evaluator's columns)
        return times
    return replace(times, forward_s=times.forward_s + sort_s,
                   backward_s=times.backward_s + sort_s,
                   elementwise_fwd_s=times.elementwise_fwd_s + sort_s)


def kv_widths(model: ModelSpec, training: TrainingSpec) -> tuple[float, float]:
    """(K, V) elements per token the attention kernel reads: the model's, or the query heads'
    widths where the trainer repeats grouped-query K/V first (``TrainingSpec.kv_repeat``)."""
    att = model.attention
    if training.kv_repeat and att.k_width < att.q_width:
        return float(att.q_width), float(att.o_width)
    return float(att.k_width), float(att.v_width)


def attention_times(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                    device: Device) -> tuple[float, float, float]:
    """(projection GEMMs forward, attention forward, attention backward) seconds of one layer,
    one micro-batch, one rank: the part of ``layer_times`` that reads only the plan's tp, cp
    and micro-batch size, so a search can share it across every MoE key with those.

    Projections (QKV + O; MLA's replicated down projection whole): TP splits each one's output
    (column-parallel) or input (row-parallel) dimension by t, on b*s/cp tokens. Attention
    scores and values: 4*b*s_q*s_kv*a*d / t per rank; causal flash kernels skip the masked
    half; without flash the s x s scores are materialised (memory-bound softmax); flash-attn's
    variable-length packing adds its copies (``copies.unpad_bytes``), a split fused QKV its
    backward concatenation (``copies.qkv_cat_bytes``), repeating grouped-query K/V its copies
    (``copies.kv_repeat_bytes``), ring attention its merges (``cp_merge_times``)."""
    t = plan.tp
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    att = model.attention
    proj = 0.0
    for projection in att.projections:
        k, n = projection.per_rank(t)
        proj += gemm_time(device, tokens, n, k)
    heads = model.num_attention_heads / t
    s_q = training.seq_len / plan.cp
    b = plan.micro_batch_size
    keys, run_keys = attended_keys(model, training.seq_len)
    score_flops = 2.0 * b * s_q * keys * heads * (att.qk_head + att.v_head)
    if training.flash_attention:
        # FlashAttention-1-class kernels run slower than FlashAttention-2 (FA1_SLOWDOWN).
        slow_f, slow_b = (1.0, 1.0) if training.flash_attention_version == 2 else \
            FA1_SLOWDOWN["triton" if training.flash_attention_triton else "cuda"]
        run = run_keys / keys  # causal (and windowed) blocks skipped
        # Short calls and narrow heads run below the long-sequence efficiency (measured); the
        # 1.x kernels lose nothing on 64-wide heads (attention_shape's docstring).
        f_fwd, f_bwd = attention_shape_factors(
            s_q, att.qk_head, narrow_head_penalty=training.flash_attention_version == 2)
        attn_fwd = slow_f * run * score_flops / (device.attention_fwd_flops * f_fwd)
        # FlashAttention's backward recomputes the scores: 2.5x the forward FLOPs, the
        # accounting under which its published backward efficiency holds (Dao 2023, sec 4.1).
        attn_bwd = slow_b * 2.5 * run * score_flops / (device.attention_bwd_flops * f_bwd)
    else:
        elems = b * heads * s_q * keys
        softmax_bytes = elems * (12.0 if training.dropout else 6.0)  # write, read, write (+drop)
        attn_fwd = score_flops / device.matmul_flops + softmax_bytes / device.memory_Bps
        attn_bwd = 2.0 * score_flops / device.matmul_flops + 2.0 * softmax_bytes / \
            device.memory_Bps
    qkv = (att.q_width + att.k_width + att.v_width) / t  # the projection's q, k, v per token
    if training.attention_unpad and training.flash_attention:
        fwd_b, bwd_b = unpad_bytes(qkv, att.o_width / t, training.compute_bytes)
        attn_fwd += b * s_q * fwd_b / device.memory_Bps
        attn_bwd += b * s_q * bwd_b / device.memory_Bps
    if training.qkv_split_cat:  # the backward's cat of dq, dk, dv
        attn_bwd += b * s_q * qkv_cat_bytes(qkv, training.compute_bytes) / device.memory_Bps
    k_rep, v_rep = kv_widths(model, training)
    if k_rep != att.k_width:
        copy = kv_repeat_bytes(att.k_width / t, att.v_width / t, k_rep / t, v_rep / t,
                               training.compute_bytes, fused=training.kernels == "fused")
        attn_fwd += b * s_q * copy / device.memory_Bps
        attn_bwd += b * s_q * copy / device.memory_Bps
    if plan.cp > 1:
        merge_f, merge_b = cp_merge_times(model, training, plan, device)
        attn_fwd += merge_f
        attn_bwd += merge_b
    return proj, attn_fwd, attn_bwd


def cp_merge_times(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                   device: Device) -> tuple[float, float]:
    """(forward, backward) seconds ring attention spends outside its attention kernels, one
    layer and micro-batch (``plan.cp`` > 1).

    Each of the cp ring steps is its own attention call on the local queries against one
    block of keys and values (Transformer Engine ``AttnFuncWithCPAndKVP2P``; PyTorch's
    ``context_parallel`` likewise), so the partial results must be merged: every step after
    the first rescales and adds its output into the running one (TE
    ``flash_attn_fwd_out_correction``: ``out.add_(out_per_step * exp(lse_step - lse))``:
    read the step's output, read and write the running output, 6 B per 16-bit element), and
    the backward adds each step's dQ into dQ and each step's dK/dV into the block's (the same
    6 B per element, on q and on k and v). Counted at 16-bit accumulators, the least traffic
    an implementation can have; every step also launches its own kernels
    (``KERNEL_OVERHEAD_S`` for the attention call, the merge and the receive wait: three per
    step). PyTorch's ``context_parallel`` (``training.cp_merge == "eager_fp32"``) merges in
    eager fp32 ops instead: ``copies.eager_ring_bytes``."""
    steps = plan.cp - 1
    rows = plan.micro_batch_size * training.seq_len / plan.cp
    att = model.attention
    q_elems = rows * att.o_width / plan.tp
    kv_elems = rows * sum(kv_widths(model, training)) / plan.tp
    if training.cp_merge == "eager_fp32":
        fwd_b, bwd_b, kernels = eager_ring_bytes(plan.cp, q_elems, kv_elems,
                                                 float(training.compute_bytes))
        return (fwd_b / device.memory_Bps + kernels[0] * KERNEL_OVERHEAD_S,
                bwd_b / device.memory_Bps + kernels[1] * KERNEL_OVERHEAD_S)
    scale = training.compute_bytes / 2
    launch = 3 * KERNEL_OVERHEAD_S * steps
    fwd = steps * 6.0 * q_elems * scale / device.memory_Bps + launch
    bwd = steps * 6.0 * (q_elems + kv_elems) * scale / device.memory_Bps + launch
    return fwd, bwd
