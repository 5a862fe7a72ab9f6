"""The shape of one attention block: its projections, per-token widths and parameters.

Standard (multi-head or grouped-query) attention projects the hidden state to queries (a*d)
and to keys and values (g*d each, g key/value heads), then back from a*d to h (Vaswani et al.
2017; Ainslie et al. 2023 for GQA).

Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 sec 2.1.2 eq. 9-19; DeepSeek-V3,
arXiv:2412.19437 sec 2.1.1; Hugging Face ``modeling_deepseek_v3.py``): the hidden state is
projected down to a query latent (``q_lora_rank``, with its RMSNorm) and to a key/value latent
(``kv_lora_rank``, with its RMSNorm) plus one shared rotary key (``qk_rope_head_dim``); the
query latent is projected up to a*(d_nope + d_rope), the key/value latent to a*(d_nope + d_v);
the output projection maps a*d_v back to h. Megatron-Core (``multi_latent_attention.py``) runs
the down projections replicated on every tensor-parallel rank (``parallel_mode="duplicated"``)
and splits the up and output projections by TP as for standard attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from paraplan.specs.model import ModelSpec

Split = Literal["column", "row", "none"]


@dataclass(frozen=True)
class Projection:
    """One forward GEMM per token: ``k_in`` -> ``n_out`` features. Tensor parallelism splits
    ``n_out`` (column-parallel), ``k_in`` (row-parallel) or nothing (replicated)."""

    k_in: int
    n_out: int
    split: Split

    def per_rank(self, tp: float) -> tuple[float, float]:
        """(k, n) of this GEMM on one of ``tp`` ranks."""
        if self.split == "column":
            return self.k_in, self.n_out / tp
        if self.split == "row":
            return self.k_in / tp, self.n_out
        return self.k_in, self.n_out


@dataclass(frozen=True)
class AttentionShape:
    """Per-token widths (elements) and parameters of one attention block."""

    projections: tuple[Projection, ...]
    q_width: int
    """Query elements per token (a * qk head width)."""
    k_width: int
    """Key elements per token that the attention kernel reads (g*d; MLA: a*(d_nope+d_rope))."""
    v_width: int
    """Value elements per token (g*d; MLA: a*d_v)."""
    o_width: int
    """Attention output elements per token (a * value head width), the O-projection input."""
    latent_width: int
    """MLA latents per token (query latent + key/value latent + rotary key), replicated on
    every TP rank; 0 for standard attention."""
    qk_head: int
    v_head: int
    rope_width: int
    """Elements per token that rotary embedding rotates (queries and keys)."""
    params: int

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs of all projections for one token: 2 * k * n each."""
        return sum(2.0 * p.k_in * p.n_out for p in self.projections)


def attention_shape(m: ModelSpec) -> AttentionShape:
    """The attention block of ``m`` (raises ValueError on a half-given MLA shape)."""
    h, a = m.hidden_size, m.num_attention_heads
    mla = (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim)
    if m.kv_lora_rank is None:
        if any(x is not None for x in mla):
            raise ValueError("q_lora_rank, qk_nope_head_dim and qk_rope_head_dim need "
                             "kv_lora_rank (multi-head latent attention)")
        return _standard(m)
    if None in (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim):
        raise ValueError("multi-head latent attention needs kv_lora_rank, qk_nope_head_dim, "
                         "qk_rope_head_dim and v_head_dim")
    if m.num_kv_heads not in (None, a):
        raise ValueError(f"num_kv_heads={m.num_kv_heads} must equal num_attention_heads={a} "
                         "under multi-head latent attention")
    nope, rope, dv = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    kv_rank, q_rank = m.kv_lora_rank, m.q_lora_rank
    qk = nope + rope
    down = (q_rank or 0) + kv_rank + rope
    proj = [Projection(h, down, "none")]
    proj.append(Projection(q_rank or h, a * qk, "column"))
    proj.append(Projection(kv_rank, a * (nope + dv), "column"))
    proj.append(Projection(a * dv, h, "row"))
    norms = (q_rank or 0) + kv_rank  # latent RMSNorms
    extra = _extras(m, qk)
    bias = (a * qk + a * (nope + dv) + h) if m.use_bias else 0
    return AttentionShape(
        projections=tuple(proj), q_width=a * qk, k_width=a * qk, v_width=a * dv,
        o_width=a * dv, latent_width=down, qk_head=qk, v_head=dv,
        rope_width=a * rope + rope, params=_weights(proj) + norms + extra + bias)


def _standard(m: ModelSpec) -> AttentionShape:
    h, a, g = m.hidden_size, m.num_attention_heads, m.kv_heads
    d = m.head_dim or h // a
    q, kv = a * d, g * d
    proj = (Projection(h, q + 2 * kv, "column"), Projection(q, h, "row"))
    bias = 0
    if m.use_bias:
        bias = q + 2 * kv + h
    elif m.qkv_bias:
        bias = q + 2 * kv
    return AttentionShape(
        projections=proj, q_width=q, k_width=kv, v_width=kv, o_width=q, latent_width=0,
        qk_head=d, v_head=d, rope_width=q + kv, params=_weights(proj) + bias + _extras(m, d))


def _weights(projections: list[Projection] | tuple[Projection, ...]) -> int:
    """Weight elements of the projections: k_in * n_out each."""
    return sum(p.k_in * p.n_out for p in projections)


def _extras(m: ModelSpec, qk_head: int) -> int:
    """q/k RMSNorm weights (one per head width each) and one sink logit per head."""
    return (2 * qk_head if m.qk_norm else 0) + (m.num_attention_heads if m.attention_sinks
                                                 else 0)


def attended_keys(m: ModelSpec, seq_len: int) -> tuple[float, float]:
    """(model, executed) keys per query, averaged over the layers.

    Model convention (Megatron's FLOP count, ``simulator.flops``): every query of a full
    attention layer meets all s keys; of a local layer, min(w, s). Executed by a causal flash
    kernel that skips masked blocks (Dao 2023, FlashAttention-2 sec 3.1; its ``window_size``
    for sliding windows): full causal s / 2 on average (the half above the diagonal skipped);
    a sliding window of w keys w - w^2 / (2s) (the first w queries see fewer); chunks of c
    tokens c / 2.
    """
    s = float(seq_len)
    n_local = m.local_attention_layers
    n_full = m.num_layers - n_local
    model_keys, run_keys = n_full * s, n_full * s / 2
    if n_local:
        w = float(min(m.local_attention_window or seq_len, seq_len))
        model_keys += n_local * w
        if m.local_attention == "chunked":
            run_keys += n_local * w / 2
        else:
            run_keys += n_local * (w - w * w / (2 * s))
    return model_keys / m.num_layers, run_keys / m.num_layers
