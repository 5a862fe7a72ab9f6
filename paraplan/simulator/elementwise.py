"""Memory traffic of a layer's non-GEMM ops (norms, residual adds, rotary, activations, MoE
routing), per token and rank, counted kernel by kernel for fused and eager stacks. The
roofline in ``compute`` runs these bytes at the achievable memory bandwidth. Bytes; no times.
"""

from __future__ import annotations

from paraplan.simulator import moe as routing
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

# gpt-oss's clamped GLU (``ModelSpec.glu_clamp``), bytes per unit of the expert width beyond
# the fused gated activation's 6: Megatron-Core's TEGroupedMLP (experts.py
# ``weighted_bias_quick_geglu_impl`` at 3097d81, Megatron-Bridge 26.04) clamps the gate half
# and the linear half in two eager ops (read + write 2 B each: 4 + 4) and concatenates them
# again (``torch.cat``: 4 + 4) before the compiled activation kernel; eager stacks run the two
# clamps, the ``x_linear + 1`` and the alpha-scaled sigmoid's extra multiply (8 + 4 + 8) on
# top of their SwiGLU's 10.
GLU_CLAMP_BYTES = {"fused": 16.0, "eager": 20.0}
# Expert biases (``use_bias`` MoE models, gpt-oss), bytes per hidden element of each routed
# row: the grouped GEMM takes no bias for the second matrix, so Megatron-Core adds it expert by
# expert after scaling it by the routing weight (experts.py ``_apply_bias``: ``t + b * p``, then
# ``torch.cat``): write b * p (2), read both and write (6), the concatenation (4); an eager
# stack's indexed bias add writes the gathered bias (2) and adds (6).
EXPERT_BIAS_BYTES = {"fused": 12.0, "eager": 8.0}
# Megatron-Core's unfused RoPE (``_apply_rotary_pos_emb_bshd``, rope_utils.py at core_r0.16),
# bytes per 16-bit element of q and k in the forward: ``t * cos`` (read + write: 4), the
# rotated half (negate one half: 2, concatenate: 4), ``* sin`` (4), the sum (6) and the
# closing ``torch.cat`` with the (empty) pass-through part (4), against the fused kernel's 4.
# Megatron takes it whenever YaRN's attention factor is not 1 (``TrainingSpec.fused_rope_scales``).
UNFUSED_ROPE_BYTES = 24.0
# Single-kernel norms and activations do not stream at a copy's bandwidth: each row's
# reduction (norms) or the transcendental math and two inputs (gated activations) hold them
# below it. Measured on an H200 at its power-limited clock (benchmarks/device/
# measure_h200_kernels.py, results/h200_kernels_2026-11-28.json; PyTorch 2.11 native
# kernels, 64 Mi bf16 elements, forward + backward against the bytes counted here, 3x the
# forward's): LayerNorm 0.41-0.52 of HBM peak over h = 768..8192 (mean 0.45), RMSNorm
# 0.47-0.56 (0.52), GELU 0.80, SiLU-and-multiply 0.56, while a residual add reaches 0.89 and a
# copy 0.81-0.85, the ``memory_bandwidth_efficiency`` every profile prices memory-bound work
# at (0.9). So a fused norm's bytes cost 0.9 / 0.45 = 2.0x (RMSNorm 0.9 / 0.52 = 1.73x) and a
# fused activation's 0.9 / 0.80 = 1.12x (gated: 0.9 / 0.56 = 1.6x) copy-equivalent bytes. Only
# PyTorch's native kernels on one H200 were measured (no Transformer Engine on the lent
# machine): fused stacks' norm and activation kernels, and every other GPU, are priced with
# the same fractions of their own achievable bandwidth. Eager stacks' many small kernels
# (fp32 RMSNorm, silu then multiply) are counted kernel by kernel at copy speed already.
NORM_KERNEL_COST = {"layernorm": 0.9 / 0.45, "rmsnorm": 0.9 / 0.52}
ACTIVATION_KERNEL_COST = {"gated": 0.9 / 0.56, "plain": 0.9 / 0.80}


def norm_bytes(kind: str, *, eager: bool) -> float:
    """Bytes per element of one norm's forward: an eager stack's RMSNorm runs in fp32 ops
    (upcast, square, mean, scale, downcast, weight: 36); a single norm kernel reads and writes
    once (4) at its measured cost (``NORM_KERNEL_COST``)."""
    return 36.0 if eager and kind == "rmsnorm" else 4.0 * NORM_KERNEL_COST[kind]


def rope_bytes(model: ModelSpec, training: TrainingSpec) -> float:
    """Bytes per q/k element of the rotary embedding's forward: eager PyTorch's fp32 complex
    views (20), one fused kernel (4), or Megatron-Core's unfused ops when YaRN scales cos and
    sin and its fused kernel cannot (``UNFUSED_ROPE_BYTES``)."""
    if training.kernels == "eager":
        return 20.0
    factor = model.rope_attention_factor
    if factor is not None and factor != 1.0 and not training.fused_rope_scales:
        return UNFUSED_ROPE_BYTES
    return 4.0


def elementwise_bytes_per_token(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                                *, moe: bool) -> float:
    """Bytes of memory traffic of one layer's forward non-GEMM ops, per token (one rank).

    Counted per op from the kernels each implementation launches (read + write bytes per
    element). Fused (Megatron fused kernels, torch.compile): a norm reads and writes once
    (4 B/element), a residual add reads two and writes one (6), rotary reads and writes q/k
    (4), the MLP activation reads its input(s) and writes once (4, or 6 when gated), dropout
    writes a 1-byte mask too. Eager PyTorch (torchtitan without compile): RMSNorm in fp32
    (upcast, square, mean, scale, downcast, weight: 36 B/element), rotary through fp32
    complex views (20), SwiGLU as silu then multiply (10); LayerNorm and GELU are single
    native kernels either way. MoE layers add routing their tokens to the experts and back
    (``moe.permute_elements_per_token``, on the rank's own tokens: the mean load); the expert
    activation runs on the busiest rank's rows (``moe.load_factor``). gpt-oss's clamped GLU
    (``ModelSpec.glu_clamp``) clamps both halves outside the fused kernel and Megatron copies
    them back together first (``GLU_CLAMP_BYTES``); expert biases are added outside the
    grouped GEMM (``EXPERT_BIAS_BYTES``). Counts are for 16-bit elements and scale with the
    element size (fp32 training: x2).
    """
    return (shared_elementwise_bytes_per_token(model, training, plan, moe=moe)
            + (routed_elementwise_bytes_per_token(model, training, plan) if moe else 0.0))


def activation_bytes(model: ModelSpec, training: TrainingSpec) -> float:
    """Bytes per element of the MLP activation's forward (``elementwise_bytes_per_token``)."""
    eager = training.kernels == "eager"
    gated = model.mlp_matrices == 3
    act = (10.0 if eager else 6.0 * ACTIVATION_KERNEL_COST["gated"]) if gated else \
        4.0 * ACTIVATION_KERNEL_COST["plain"]
    if gated and model.glu_clamp:
        act += GLU_CLAMP_BYTES["eager" if eager else "fused"]
    return act


def shared_elementwise_bytes_per_token(model: ModelSpec, training: TrainingSpec,
                                       plan: ParallelPlan, *, moe: bool) -> float:
    """``elementwise_bytes_per_token`` without the routed experts' part: what does not read
    the plan's ep or expert TP (norms, residual adds, rotary, q/k norms, the dense MLP's or
    the shared experts' activation, dropout)."""
    h = model.hidden_size
    t = plan.tp
    sp = t if plan.sequence_parallel else 1
    eager = training.kernels == "eager"
    norm = norm_bytes(model.norm, eager=eager)
    # Shared experts (and the dense MLP) are TP-split.
    ffn = model.ffn_hidden_size / t if not moe else model.expert_ffn * \
        model.num_shared_experts / t
    per_token = (2 * norm + 2 * 6.0) * h / sp
    att = model.attention
    rope = rope_bytes(model, training) if model.position_embedding == "rope" else 0.0
    per_token += rope * att.rope_width / t
    if model.qk_norm:  # per-head RMSNorm of q and k (RMSNorm whatever the layer norm is)
        per_token += norm_bytes("rmsnorm", eager=eager) * (att.q_width + att.k_width) / t
    per_token += activation_bytes(model, training) * ffn
    if training.dropout:
        # Twice per layer. Fused stacks run bias + dropout + residual add as one kernel:
        # Megatron-LM's ``bias_dropout_add_fused_train`` (megatron/model/transformer.py, a
        # torch.jit.script function, ``--bias-dropout-fusion`` on by default), whose dropout
        # TorchScript's autodiff lowers on CUDA to ``rand_like(x) < 1 - p`` times x "because
        # cuda fuser can efficiently fuse those operations" (torch/csrc/jit/runtime/
        # symbolic_script.cpp ``dropout``), so the legacy fuser of the 2021 code and nvfuser
        # after it fuse the lot: it reads x and the residual and writes the sum and a 1-byte
        # mask, 7 bytes where the residual add above counted 6: one more. Eager: a dropout
        # kernel of its own (read, write, mask: 5) before the add.
        per_token += 2 * (1.0 if training.kernels == "fused" else 5.0) * h / sp
    # The byte counts above are for 16-bit tensors; fp32 training moves twice as many.
    return per_token * training.compute_bytes / 2


def routed_elementwise_bytes_per_token(model: ModelSpec, training: TrainingSpec,
                                       plan: ParallelPlan) -> float:
    """The routed experts' part of an MoE layer's ``elementwise_bytes_per_token``: their
    activation, routing the tokens to them and back, their biases. It reads the plan only
    through ep, expert TP, the expert-TP gather, the sequence-parallel split and the load
    factor (``moe.expert_shape``)."""
    h = model.hidden_size
    eager = training.kernels == "eager"
    # Routed rows are ffn / etp wide (``moe.routed_copies_per_token``), as many as the busiest
    # rank receives (``moe.load_factor``, as its expert GEMMs).
    rows = routing.routed_copies_per_token(model, plan) * routing.load_factor(training, plan)
    per_token = activation_bytes(model, training) * model.expert_ffn * rows / plan.expert_tp
    # Routing runs on the T dispatched tokens, b s / (cp tp) under SP (not the b s / cp).
    per_token += (2.0 * routing.permute_elements_per_token(model, plan, eager=eager)
                  / routing.sp_split(plan))
    if model.use_bias:  # every routed row's second expert matrix adds its bias
        per_token += EXPERT_BIAS_BYTES["eager" if eager else "fused"] * h * rows
    return per_token * training.compute_bytes / 2
