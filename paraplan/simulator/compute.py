"""Time of forward/backward passes on one GPU: a per-op roofline.

GEMMs run at ``max(flops / (peak * matmul_efficiency), bytes / effective_bandwidth)`` plus a
per-kernel overhead, so small or skinny GEMMs become memory- or launch-bound on their own
(Williams et al. 2009, "Roofline"). Fused attention runs at a fraction of the GEMM efficiency
(FlashAttention-2, Dao 2023, sec 4.1: 73% of peak forward and 63% backward on A100 versus ~87%
for cuBLAS GEMMs, i.e. 0.84x and 0.72x). Norms, activations, residual adds, rotary
embeddings, softmax (without flash) and the optimizer step are memory-bound and run at the
achievable memory bandwidth. One set of parameters per GPU profile; nothing is fitted per run.
All times are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.specs.cluster import GPUSpec
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

FLASH_FWD_RELATIVE = 0.73 / 0.87  # FlashAttention-2 fwd vs cuBLAS GEMM efficiency (Dao 2023)
FLASH_BWD_RELATIVE = 0.63 / 0.87
KERNEL_OVERHEAD_S = 2e-6  # per-kernel ramp-up/tail and launch gap on a busy stream
KERNELS_PER_LAYER_FWD = 12  # norms, QKV, rope, attention, proj, adds, MLP matmuls, activation


@dataclass(frozen=True)
class Device:
    """What the roofline needs from a GPU for one precision (FLOP/s and bytes/s)."""

    matmul_flops: float
    """Achievable dense GEMM throughput, FLOP/s (peak * matmul_efficiency)."""
    memory_Bps: float
    """Achievable memory bandwidth, bytes/s (peak * memory_bandwidth_efficiency)."""

    @classmethod
    def of(cls, gpu: GPUSpec, precision: str) -> Device:
        peak = gpu.peak_flops(precision) if precision in gpu.peak_tflops else \
            gpu.peak_flops("fp16")
        return cls(peak * gpu.matmul_efficiency,
                   gpu.memory_bandwidth_GBps * 1e9 * gpu.memory_bandwidth_efficiency)


def gemm_time(device: Device, m: float, n: float, k: float, elem_bytes: float = 2.0) -> float:
    """Roofline time of one (m x k) @ (k x n) GEMM, seconds."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2.0 * m * n * k
    traffic = elem_bytes * (m * k + k * n + m * n)
    return max(flops / device.matmul_flops, traffic / device.memory_Bps) + KERNEL_OVERHEAD_S


@dataclass(frozen=True)
class LayerTimes:
    """Compute time of one layer for one micro-batch on one rank (no communication)."""

    forward_s: float
    backward_s: float
    """Input- plus weight-gradient time (2x the GEMMs), without recomputation."""
    weight_grad_s: float
    """The weight-gradient part of backward_s (the W pass of zero-bubble schedules)."""
    attention_fwd_s: float
    """Attention score/value part of forward_s (what selective recompute re-runs)."""


def layer_times(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, device: Device,
                *, moe: bool) -> LayerTimes:
    """Forward/backward compute time of one layer, one micro-batch, one rank (seconds).

    Tokens per rank: b*s/cp. TP splits every projection's output (column-parallel) or input
    (row-parallel) dimension by t; experts are split by expert-TP, and under EP each rank's
    experts see, on average, top_k * tokens tokens in total.
    """
    t = plan.tp
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    h, d = model.hidden_size, model.head_size
    q_out = model.num_attention_heads * d / t
    kv_out = model.kv_heads * d / t
    gate = 2 if model.mlp_matrices == 3 else 1

    proj = gemm_time(device, tokens, q_out + 2 * kv_out, h) + gemm_time(device, tokens, h, q_out)
    if moe:
        etp = plan.expert_tp
        ffn = model.expert_ffn / etp
        experts_here = max(1, model.num_experts // plan.ep)
        routed = tokens * model.moe_top_k * plan.ep / model.num_experts  # tokens per expert
        per_expert = gemm_time(device, routed, gate * ffn, h) + gemm_time(device, routed, h, ffn)
        mlp = experts_here * per_expert + gemm_time(device, tokens, model.num_experts, h)
        if model.num_shared_experts:
            mlp += model.num_shared_experts * (gemm_time(device, tokens, gate * ffn, h)
                                               + gemm_time(device, tokens, h, ffn))
    else:
        ffn = model.ffn_hidden_size / t
        mlp = gemm_time(device, tokens, gate * ffn, h) + gemm_time(device, tokens, h, ffn)

    # Attention scores and values: 4*b*s_q*s_kv*a*d / t per rank; causal flash kernels skip
    # the masked half; without flash the s x s scores are materialised (memory-bound softmax).
    heads = model.num_attention_heads / t
    s_q = training.seq_len / plan.cp
    b = plan.micro_batch_size
    score_flops = 4.0 * b * s_q * training.seq_len * heads * d
    if training.flash_attention:
        attn_fwd = 0.5 * score_flops / (device.matmul_flops * FLASH_FWD_RELATIVE)
        attn_bwd = 2.0 * 0.5 * score_flops / (device.matmul_flops * FLASH_BWD_RELATIVE)
    else:
        elems = b * heads * s_q * training.seq_len
        softmax_bytes = elems * (12.0 if training.dropout else 6.0)  # write, read, write (+drop)
        attn_fwd = score_flops / device.matmul_flops + softmax_bytes / device.memory_Bps
        attn_bwd = 2.0 * score_flops / device.matmul_flops + 2.0 * softmax_bytes / \
            device.memory_Bps

    # Memory-bound elementwise work, in elements of h per token (read + write, 2 bytes each):
    # two norms (2+2), two residual adds (3+3), rotary on q and k, the MLP activation, dropout.
    sp = t if plan.sequence_parallel else 1
    ffn_full = (model.expert_ffn * (model.moe_top_k + model.num_shared_experts)
                if moe else model.ffn_hidden_size)
    elementwise = (10.0 / sp + 2.0 * (1 + model.kv_heads / model.num_attention_heads) / t
                   + (gate + 1) * ffn_full / (h * (plan.expert_tp if moe else t))
                   + (5.0 / sp if training.dropout else 0.0))
    elem_fwd = 2.0 * tokens * h * elementwise / device.memory_Bps
    overhead = KERNELS_PER_LAYER_FWD * KERNEL_OVERHEAD_S

    gemms = proj + mlp
    forward = gemms + attn_fwd + elem_fwd + overhead
    backward = 2.0 * gemms + attn_bwd + 2.0 * elem_fwd + 2.0 * overhead
    return LayerTimes(forward, backward, gemms, attn_fwd)


def lm_head_times(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                  device: Device) -> tuple[float, float]:
    """(forward, backward) seconds of the vocab-parallel LM head + cross entropy (1 micro-batch)."""
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    v = model.vocab_size / plan.tp
    gemm = gemm_time(device, tokens, v, model.hidden_size)
    # Cross entropy in fp32: upcast, max, exp-sum, gradient: ~5 passes over 4-byte logits.
    ce = 5.0 * 4.0 * tokens * v / device.memory_Bps
    return gemm + ce, 2.0 * gemm + ce


def optimizer_step_time(params_on_rank: float, training: TrainingSpec, device: Device) -> float:
    """Memory-bound optimizer update of ``params_on_rank`` parameters (seconds).

    Adam with fp32 master: read+write master, momentum, variance (24 B), read grads twice
    (norm/clip and update, 4 B), write 16-bit weights (2 B) = 30 bytes per parameter.
    """
    states = training.optimizer_state_bytes_per_param
    per_param = 2.0 * states + 2.0 * training.compute_bytes + training.compute_bytes
    return params_on_rank * per_param / device.memory_Bps
