"""ModelSpec: the shape of a decoder-only transformer (dense or MoE) and its parameter counts.

Parameter counting follows the standard decomposition (Narayanan et al. 2021, eq. for
12*l*h^2 + 2*v*h with l layers, h hidden, v vocab): per layer attention Q/K/V/O projections,
the MLP (2 matrices of h x ffn for GELU-style, 3 for gated SwiGLU/GeGLU), MoE experts and
router, norms; plus word embedding, LM head (unless tied) and learned positions.

Attention variants (``specs.attention``): grouped-query, multi-head latent attention
(DeepSeek-V2/V3), per-head q/k norms (Qwen3), attention sinks (gpt-oss) and local
(sliding-window or chunked) attention on some layers (gpt-oss, Llama 4). MoE layers may follow
leading dense layers (DeepSeek) and interleave with dense ones (Llama 4); DeepSeek-V3's
multi-token-prediction modules are counted apart (``mtp_params``), as the authors count them.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from paraplan.specs.attention import AttentionShape, attention_shape
from paraplan.specs.base import StrictModel

Activation = Literal["gelu", "swiglu", "geglu", "squared_relu", "relu"]
ModelFeature = Literal["mla", "qk_norm", "attention_sinks", "sliding_window",
                       "chunked_attention", "mtp", "interleaved_moe"]
GATED_ACTIVATIONS = frozenset({"swiglu", "geglu"})


class ModelSpec(StrictModel):
    """A decoder-only transformer. Sizes are counts (not bytes)."""

    name: str = Field(min_length=1)
    """Preset name or a user's label."""
    display_name: str | None = None
    family: str | None = None
    num_layers: int = Field(gt=0, le=10_000)
    """Transformer blocks (l)."""
    hidden_size: int = Field(gt=0, le=1_000_000)
    """Model width (h)."""
    num_attention_heads: int = Field(gt=0, le=100_000)
    """Query heads (a)."""
    num_kv_heads: int | None = Field(default=None, gt=0, le=100_000)
    """Key/value heads for grouped-query attention; None means = num_attention_heads (MHA)."""
    head_dim: int | None = Field(default=None, gt=0, le=100_000)
    """Per-head width; None means hidden_size / num_attention_heads."""
    ffn_hidden_size: int = Field(gt=0, le=10_000_000)
    """MLP intermediate width of a dense layer."""
    vocab_size: int = Field(gt=0, le=100_000_000)
    activation: Activation = "gelu"
    """gelu/squared_relu/relu: 2 matrices of h x ffn; swiglu/geglu: 3 (gated)."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position_embedding: Literal["learned", "rope", "alibi"] = "rope"
    max_position_embeddings: int | None = Field(default=None, gt=0, le=100_000_000)
    tie_word_embeddings: bool = False
    use_bias: bool = False
    """All linear layers carry biases (GPT-2/3, BLOOM, GPT-NeoX)."""
    glu_clamp: float | None = Field(default=None, gt=0, le=1_000_000)
    """A gated MLP that clamps its gate half at this value from above and its linear half to
    +-this value, and adds 1 to the linear half (gpt-oss ``swiglu_limit`` 7.0: openai/gpt-oss
    gpt_oss/torch/model.py ``swiglu``); None: a plain GLU."""
    rope_attention_factor: float | None = Field(default=None, gt=0, le=100)
    """YaRN's attention factor ("mscale", the concentration factor): rotary embeddings multiply
    their cos and sin by it (Peng et al. 2023, arXiv:2309.00071 eq. 22; transformers
    ``_compute_yarn_parameters``: 0.1 ln(factor) + 1 unless ``attention_factor`` or
    mscale / mscale_all_dim are given). gpt-oss: factor 32 -> 1.3466; None or 1.0: plain RoPE
    (DeepSeek-V3's mscale / mscale_all_dim cancel to 1.0)."""
    qkv_bias: bool = False
    """Only the Q/K/V projections carry biases (Qwen2)."""
    embedding_layernorm: bool = False
    """A norm right after the word embedding (BLOOM)."""
    num_experts: int = Field(default=0, ge=0, le=100_000)
    """Routed experts per MoE layer; 0 = dense model."""
    moe_top_k: int = Field(default=0, ge=0, le=100_000)
    moe_ffn_hidden_size: int | None = Field(default=None, gt=0, le=10_000_000)
    """Per-expert MLP width; None means ffn_hidden_size."""
    num_shared_experts: int = Field(default=0, ge=0, le=1_000)
    """Always-active experts of width moe_ffn_hidden_size (DeepSeek-MoE)."""
    first_dense_layers: int = Field(default=0, ge=0)
    """Leading layers that are dense (ffn_hidden_size) in an MoE model (DeepSeek-MoE)."""
    moe_layer_step: int = Field(default=1, ge=1, le=10_000)
    """Every ``moe_layer_step``-th layer after the leading dense ones is MoE, the others dense
    (Llama 4 ``interleave_moe_layer_step``: layers step-1, 2*step-1, ...); 1 = all."""
    q_lora_rank: int | None = Field(default=None, gt=0, le=1_000_000)
    """Multi-head latent attention (DeepSeek-V2/V3): query down-projection rank; None with
    ``kv_lora_rank`` set = queries projected directly (DeepSeek-V2-Lite)."""
    kv_lora_rank: int | None = Field(default=None, gt=0, le=1_000_000)
    """MLA: the compressed key/value latent width; set = the model uses MLA."""
    qk_nope_head_dim: int | None = Field(default=None, gt=0, le=100_000)
    qk_rope_head_dim: int | None = Field(default=None, gt=0, le=100_000)
    v_head_dim: int | None = Field(default=None, gt=0, le=100_000)
    qk_norm: bool = False
    """Per-head RMSNorm weights on queries and keys (Qwen3 ``q_norm``/``k_norm``)."""
    attention_sinks: bool = False
    """One learned sink logit per head and layer (gpt-oss)."""
    local_attention: Literal["sliding", "chunked"] | None = None
    """Local attention on ``local_attention_layers`` layers: a sliding window of the last
    ``local_attention_window`` keys (gpt-oss), or chunks of that many tokens attending only
    within the chunk (Llama 4 ``attention_chunk_size``)."""
    local_attention_window: int | None = Field(default=None, gt=0, le=100_000_000)
    local_attention_layers: int = Field(default=0, ge=0)
    moe_router_groups: int | None = Field(default=None, ge=1, le=100_000)
    """Group-limited routing (DeepSeek-V3 ``n_group``): the experts form this many equal
    groups and each token picks its experts from ``moe_router_group_topk`` groups only."""
    moe_router_group_topk: int | None = Field(default=None, ge=1, le=100_000)
    """Groups a token may route to (DeepSeek-V3 ``topk_group``: 4 of 8, its node limit)."""
    num_mtp_layers: int = Field(default=0, ge=0, le=100)
    """Multi-token-prediction modules (DeepSeek-V3 ``num_nextn_predict_layers``): each is one
    more MoE block, a 2h x h projection and two norms on the last stage, sharing the
    embedding and output head, run on every step in training."""
    published_params_b: float | None = Field(default=None, gt=0)
    """Total parameters the authors publish, billions (for tests and display only)."""
    published_active_params_b: float | None = Field(default=None, gt=0)
    published_active_excludes_embedding: bool = False
    """The authors' active count leaves out the input embedding table (gpt-oss model card)."""
    sources: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        kv = self.kv_heads
        if kv > self.num_attention_heads or self.num_attention_heads % kv:
            raise ValueError(
                f"num_kv_heads={kv} must divide num_attention_heads={self.num_attention_heads}"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; set head_dim explicitly"
            )
        if self.num_experts:
            if not 1 <= self.moe_top_k <= self.num_experts:
                raise ValueError(
                    f"moe_top_k={self.moe_top_k} must be in 1..num_experts={self.num_experts}"
                )
            if self.first_dense_layers >= self.num_layers:
                raise ValueError(
                    f"first_dense_layers={self.first_dense_layers} must be < num_layers="
                    f"{self.num_layers}"
                )
            groups, pick = self.moe_router_groups, self.moe_router_group_topk
            if (groups is None) != (pick is None):
                raise ValueError("moe_router_groups and moe_router_group_topk are set together")
            if groups is not None and (self.num_experts % groups or pick > groups
                                       or pick * (self.num_experts // groups) < self.moe_top_k):
                raise ValueError(
                    f"moe_router_groups={groups} must divide num_experts={self.num_experts} and "
                    f"moe_router_group_topk={pick} groups must hold moe_top_k={self.moe_top_k} "
                    "experts")
        elif (self.moe_top_k or self.num_shared_experts or self.first_dense_layers
              or self.moe_layer_step > 1 or self.num_mtp_layers or self.moe_router_groups):
            raise ValueError("moe_top_k, num_shared_experts, first_dense_layers, "
                             "moe_layer_step, num_mtp_layers and moe_router_groups need "
                             "num_experts > 0")
        if self.is_moe and not self.num_moe_layers:
            raise ValueError(f"moe_layer_step={self.moe_layer_step} leaves no MoE layer among "
                             f"num_layers={self.num_layers}")
        if self.local_attention_layers > self.num_layers:
            raise ValueError(f"local_attention_layers={self.local_attention_layers} must be "
                             f"<= num_layers={self.num_layers}")
        if (self.local_attention is None) != (self.local_attention_window is None) or (
                self.local_attention is None and self.local_attention_layers):
            raise ValueError("local_attention, local_attention_window and "
                             "local_attention_layers go together")
        attention_shape(self)  # MLA fields are all set or none (raises ValueError)
        return self

    # ---- derived shape ------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        """Key/value heads (= attention heads for MHA)."""
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        """Per-head width d (MLA: the value head width)."""
        if self.v_head_dim is not None:
            return self.v_head_dim
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @cached_property
    def attention(self) -> AttentionShape:
        """Projection shapes and per-token widths of one attention block."""
        return attention_shape(self)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def features(self) -> list[str]:
        """Architecture features a trainer's model code must have to run this model."""
        return [name for name, present in (
            ("mla", self.kv_lora_rank is not None), ("qk_norm", self.qk_norm),
            ("attention_sinks", self.attention_sinks),
            ("sliding_window", self.local_attention == "sliding"),
            ("chunked_attention", self.local_attention == "chunked"),
            ("mtp", self.num_mtp_layers > 0), ("interleaved_moe", self.moe_layer_step > 1),
        ) if present]

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of h x ffn in one MLP: 3 for gated activations, else 2."""
        return 3 if self.activation in GATED_ACTIVATIONS else 2

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def num_moe_layers(self) -> int:
        return self.moe_layers_before(self.num_layers)

    def moe_layers_before(self, index: Any) -> Any:
        """MoE layers among layers [0, index): layer i >= first_dense_layers is MoE when
        (i + 1) is a multiple of ``moe_layer_step``. Works on ints and numpy int arrays."""
        if not self.is_moe:
            return index * 0
        count = index // self.moe_layer_step - self.first_dense_layers // self.moe_layer_step
        return max(0, count) if isinstance(index, int) else np.maximum(0, count)

    def is_moe_layer(self, index: int) -> bool:
        """Layer ``index`` (0-based) has routed experts."""
        return self.moe_layers_before(index + 1) > self.moe_layers_before(index)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # ---- parameter counts (counts, not bytes) ---------------------------------------------
    @cached_property
    def attention_params(self) -> int:
        """Q, K, V, O projections of one layer (GQA shrinks K and V; MLA's down and up
        projections with their latent norms), biases, q/k norms and sinks if any."""
        return self.attention.params

    def _mlp_params(self, ffn: int) -> int:
        h = self.hidden_size
        weights = self.mlp_matrices * h * ffn
        bias = ((self.mlp_matrices - 1) * ffn + h) if self.use_bias else 0
        return weights + bias

    @cached_property
    def dense_mlp_params(self) -> int:
        """MLP of a dense layer."""
        return self._mlp_params(self.ffn_hidden_size)

    @cached_property
    def expert_params(self) -> int:
        """One expert's MLP."""
        return self._mlp_params(self.expert_ffn)

    @cached_property
    def router_params(self) -> int:
        return self.hidden_size * self.num_experts

    @cached_property
    def norm_params_per_layer(self) -> int:
        """Two norms per block; LayerNorm has weight and bias, RMSNorm weight only."""
        per_norm = 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size
        return 2 * per_norm

    @cached_property
    def dense_layer_params(self) -> int:
        return self.attention_params + self.dense_mlp_params + self.norm_params_per_layer

    @cached_property
    def moe_layer_shared_params(self) -> int:
        """The part of an MoE layer every expert-parallel rank holds (split by TP, not EP):
        attention, router, norms and the shared experts."""
        return (self.attention_params + self.router_params + self.norm_params_per_layer
                + self.num_shared_experts * self.expert_params)

    @cached_property
    def moe_layer_params(self) -> int:
        """All experts (routed + shared) of one MoE layer, plus attention, router and norms."""
        return self.moe_layer_shared_params + self.num_experts * self.expert_params

    @cached_property
    def moe_layer_active_params(self) -> int:
        """Parameters one token touches in an MoE layer (top-k routed + shared experts)."""
        experts = (self.moe_top_k + self.num_shared_experts) * self.expert_params
        return self.attention_params + experts + self.router_params + self.norm_params_per_layer

    @cached_property
    def embedding_params(self) -> int:
        """Word embedding (+ learned positions, + embedding norm)."""
        params = self.vocab_size * self.hidden_size
        if self.position_embedding == "learned":
            params += (self.max_position_embeddings or 2048) * self.hidden_size
        if self.embedding_layernorm:
            params += 2 * self.hidden_size
        return params

    @cached_property
    def lm_head_params(self) -> int:
        """Output projection (0 when tied to the word embedding) plus the final norm."""
        final_norm = 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return head + final_norm

    @property
    def embedding_on_last_stage(self) -> bool:
        """With pp > 1 the last pipeline stage holds its own copy of the word embedding, whose
        gradient the two ends sum every step: as the tied LM head, or as the multi-token-
        prediction modules' input embedding (Megatron-Core gpt_model.py builds the embedding
        where ``pre_process or mtp_process``; finalize_model_grads.py
        ``_get_shared_word_embedding_weight`` reduces it when the weights are shared or
        ``mtp_num_layers`` is set)."""
        return self.tie_word_embeddings or self.num_mtp_layers > 0

    @cached_property
    def mtp_params(self) -> int:
        """Multi-token-prediction modules (DeepSeek-V3 sec 2.2): per module one MoE block, the
        2h x h projection M and two RMSNorms; embedding and head are shared. Not in
        ``num_params``: the authors count them apart (671B main model + 14B MTP)."""
        h = self.hidden_size
        return self.num_mtp_layers * (self.moe_layer_params + 2 * h * h + 2 * h)

    @cached_property
    def mtp_expert_params(self) -> int:
        """The routed experts among ``mtp_params`` (split by EP, not TP)."""
        return self.num_mtp_layers * self.num_experts * self.expert_params

    @property
    def mtp_dense_params(self) -> int:
        """``mtp_params`` outside the routed experts (split by TP)."""
        return self.mtp_params - self.mtp_expert_params

    @cached_property
    def num_params(self) -> int:
        """Total trainable parameters (main model; ``mtp_params`` apart)."""
        layers = self.num_dense_layers * self.dense_layer_params
        layers += self.num_moe_layers * self.moe_layer_params
        return layers + self.embedding_params + self.lm_head_params

    @cached_property
    def num_active_params(self) -> int:
        """Parameters used per token (= num_params for dense models)."""
        layers = self.num_dense_layers * self.dense_layer_params
        layers += self.num_moe_layers * self.moe_layer_active_params
        return layers + self.embedding_params + self.lm_head_params

    @property
    def num_active_params_excl_embedding(self) -> int:
        """``num_active_params`` without the input embedding table (a lookup, no FLOPs)."""
        return self.num_active_params - self.embedding_params

    @property
    def published_convention_active_params(self) -> int:
        """``num_active_params`` counted as the authors count it (without the input embedding
        when ``published_active_excludes_embedding``)."""
        if self.published_active_excludes_embedding:
            return self.num_active_params_excl_embedding
        return self.num_active_params

    def describe(self) -> dict:
        """JSON-ready summary: the shape plus parameter counts (the `describe --model` contract)."""
        shape = self.model_dump(exclude={"sources"}, exclude_none=True)
        return {
            "name": self.name,
            "num_params": self.num_params,
            "num_active_params": self.num_active_params,
            "num_params_b": round(self.num_params / 1e9, 3),
            "num_active_params_b": round(self.num_active_params / 1e9, 3),
            "num_active_params_excl_embedding": self.num_active_params_excl_embedding,
            "mtp_params": self.mtp_params,
            "shape": shape,
            "sources": list(self.sources),
        }
