"""FLOPs per layer and per pass, and the model/hardware FLOPs of a training step.

Conventions: one multiply-add = 2 FLOPs; a GEMM of (m x k) @ (k x n) costs 2*m*k*n. Backward
costs twice the forward (input gradient + weight gradient), Narayanan et al. 2021 sec 5.1.
Attention scores follow Megatron's accounting (full s x s, not halved for causal masks) for
*model* FLOPs, so MFU matches the published convention; the *executed* attention FLOPs of a
causal flash-attention kernel are about half (Dao 2023, FlashAttention-2 sec 3.1: causal
blocks above the diagonal are skipped).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.simulator.selective_ac import op_sac_matmuls
from paraplan.specs.attention import attended_keys
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs of one transformer layer for ``tokens`` tokens (b*s), by part.

    ``gemm`` holds the dense projections (QKV, output, MLP or active experts, router);
    ``attention`` the score and value products (QK^T and AV) at full s x s.
    """

    gemm: float
    attention: float

    @property
    def total(self) -> float:
        return self.gemm + self.attention


def attention_projection_flops(model: ModelSpec, tokens: float) -> float:
    """Q, K, V and output projections: 2*tokens*h*(q_out + 2*kv_out) + 2*tokens*q_out*h
    (MLA: its down, up and output projections, ``specs.attention``)."""
    return tokens * model.attention.flops_per_token


def attention_score_flops(model: ModelSpec, batch: float, seq_len: int) -> float:
    """QK^T and AV over full s x s per head: 4*b*s^2*a*d (Narayanan et al. 2021, eq. 2 term);
    2*b*s*s_k*a*(d_qk + d_v) in general, with s_k the keys each query meets (s; the window on
    local-attention layers, averaged over the layers: ``specs.attention.attended_keys``)."""
    keys, _ = attended_keys(model, seq_len)
    att = model.attention
    return 2.0 * batch * seq_len * keys * model.num_attention_heads * (att.qk_head + att.v_head)


def mlp_flops(model: ModelSpec, tokens: float, ffn: int) -> float:
    """One MLP of width ``ffn``: 2*tokens*h*ffn per h x ffn matrix (2 matrices, 3 if gated)."""
    return 2.0 * tokens * model.hidden_size * ffn * model.mlp_matrices


def layer_forward_flops(model: ModelSpec, batch: float, seq_len: int, *, moe: bool) -> LayerFlops:
    """Forward FLOPs of one layer on ``batch`` sequences of ``seq_len`` tokens.

    MoE layers run the router (2*tokens*h*E) and top-k routed + shared experts per token.
    """
    tokens = batch * seq_len
    gemm = attention_projection_flops(model, tokens)
    if moe:
        experts = model.moe_top_k + model.num_shared_experts
        gemm += experts * mlp_flops(model, tokens, model.expert_ffn)
        gemm += 2.0 * tokens * model.hidden_size * model.num_experts
    else:
        gemm += mlp_flops(model, tokens, model.ffn_hidden_size)
    return LayerFlops(gemm=gemm, attention=attention_score_flops(model, batch, seq_len))


def lm_head_flops(model: ModelSpec, tokens: float) -> float:
    """Output projection to the vocabulary: 2*tokens*h*v (the embedding lookup is free)."""
    return 2.0 * tokens * model.hidden_size * model.vocab_size


def model_forward_flops(model: ModelSpec, batch: float, seq_len: int) -> float:
    """Forward FLOPs of the whole model for ``batch`` sequences (Megatron accounting), with
    the multi-token-prediction modules (``mtp_forward_flops``)."""
    dense = layer_forward_flops(model, batch, seq_len, moe=False).total
    total = model.num_dense_layers * dense
    if model.is_moe:
        total += model.num_moe_layers * layer_forward_flops(model, batch, seq_len, moe=True).total
    return total + lm_head_flops(model, batch * seq_len) + mtp_forward_flops(model, batch,
                                                                             seq_len)


def mtp_forward_flops(model: ModelSpec, batch: float, seq_len: int) -> float:
    """Forward FLOPs of the multi-token-prediction modules (DeepSeek-V3 sec 2.2): each runs
    its 2h -> h projection, one MoE block and the shared output head on every token. Megatron
    counts them in its model FLOPs (``num_floating_point_operations``, ``mtp_num_layers``)."""
    if not model.num_mtp_layers:
        return 0.0
    tokens = batch * seq_len
    block = layer_forward_flops(model, batch, seq_len, moe=True).total
    proj = 2.0 * tokens * 2 * model.hidden_size * model.hidden_size
    return model.num_mtp_layers * (block + proj + lm_head_flops(model, tokens))


def model_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int) -> float:
    """Model FLOPs of one step: 3x forward (forward + 2x backward), no recompute.

    For a dense MHA GELU model this equals Megatron's 72*B*s*l*h^2*(1 + s/(6h) + v/(12*l*h))
    (Narayanan et al. 2021 eq. 3 without the recompute pass; Korthikanti et al. 2022 sec 6).
    """
    return 3.0 * model_forward_flops(model, global_batch, seq_len)


def hardware_flops_per_step(
    model: ModelSpec, global_batch: int, seq_len: int, recompute: str, *,
    skip_down_proj: bool = False
) -> float:
    """FLOPs the hardware executes including recomputation (HFU numerator).

    With full recompute of every layer (not the LM head) this is Megatron's
    96*B*s*l*h^2*(1 + s/(6h) + v/(16*l*h)) for dense MHA GELU models (Narayanan et al. eq. 3).
    ``skip_down_proj``: the re-run stops before each dense layer's MLP down projection
    (``layer_terms.rerun_skip_time``), whose FLOPs a whole-layer re-run then leaves out.
    """
    base = model_flops_per_step(model, global_batch, seq_len)
    if recompute == "none":
        return base
    head = lm_head_flops(model, global_batch * seq_len)
    layers_fwd = model_forward_flops(model, global_batch, seq_len) - head
    if skip_down_proj:
        layers_fwd -= (model.num_dense_layers * 2.0 * global_batch * seq_len
                       * model.hidden_size * model.ffn_hidden_size)
    if recompute == "full":
        return base + layers_fwd
    if recompute == "layer":  # every other layer re-run whole
        return base + 0.5 * layers_fwd
    if recompute == "op":  # every second matmul runs again (``selective_ac``)
        calls = op_sac_matmuls(model, ParallelPlan(), moe=False)
        dense = 0.5 * layer_forward_flops(model, global_batch, seq_len, moe=False).gemm \
            if calls is None else 2.0 * global_batch * seq_len * sum(
                n * k for n, k, saved, _ in calls if not saved)
        gemm = model.num_dense_layers * dense
        if model.is_moe:
            gemm += 0.5 * model.num_moe_layers * layer_forward_flops(
                model, global_batch, seq_len, moe=True).gemm
        return base + gemm
    # Selective: re-run the attention products of every layer.
    return base + model.num_layers * attention_score_flops(model, global_batch, seq_len)


def megatron_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int, *,
                            recompute: bool) -> float:
    """Megatron's closed form (Narayanan et al. 2021 eq. 3): 72 (96 with recompute) B s l h^2 (...).

    Only exact for dense MHA models with a 4h GELU MLP; kept for conversions of published
    TFLOP/s figures and as a cross-check of the general accounting above.
    """
    b, s, layers, h, v = global_batch, seq_len, model.num_layers, model.hidden_size, \
        model.vocab_size
    if recompute:
        return 96.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    return 72.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
