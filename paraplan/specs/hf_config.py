"""Build a ModelSpec from a Hugging Face ``config.json`` (read as data, never executed).

Supported styles: Llama, Mistral, Mixtral, Qwen2 (and Qwen2-MoE), Qwen3 and Qwen3-MoE,
Gemma, DeepSeek-MoE and DeepSeek-V2/V3 (multi-head latent attention, multi-token prediction),
gpt-oss, Llama 4 (its text model), GPT-NeoX and GPT-2. Keys follow each family's
``configuration_*.py`` in transformers; defaults below are those classes' defaults (e.g. Llama
ties embeddings only when asked, GPT-2 always ties). Fields that do not change the cost
(``routed_scaling_factor``, router scoring, rope scaling other than YaRN's attention factor)
are ignored; DeepSeek's ``n_group``/``topk_group`` limit how many nodes a token's experts span.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from paraplan.specs.errors import SpecError, from_validation_error, short_repr
from paraplan.specs.model import ModelSpec

# Families whose MLP is gated (3 matrices) with a SiLU/GELU gate.
_GATED_SILU = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "deepseek", "qwen3", "olmo",
               "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "llama4", "llama4_text"}
_QK_NORM = {"qwen3", "qwen3_moe"}  # per-head RMSNorm weights on q and k (modeling_qwen3.py)
_GATED_GELU = {"gemma", "gemma2"}
_TIED_BY_DEFAULT = {"gpt2", "gemma", "gemma2"}


def _int(cfg: dict[str, Any], *keys: str, default: Any = None, required: bool = True,
         positive: bool = False) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            value = cfg[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(
                    f"config.json key {key}={short_repr(value)} must be an integer",
                    field=key,
                    value=value,
                    allowed="integer",
                )
            if (positive and value <= 0) or value < 0:
                raise SpecError(f"config.json key {key}={value} must be "
                                f"{'> 0' if positive else '>= 0'}", field=key, value=value,
                                allowed="> 0" if positive else ">= 0")
            return value
    if required and default is None:
        raise SpecError(
            f"config.json has none of the keys {list(keys)}; a model needs it",
            field=keys[0],
            allowed="an integer under one of these keys",
        )
    return default


_HF_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "ffn_hidden_size": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "num_experts": ("num_local_experts", "n_routed_experts", "num_experts"),
    "moe_top_k": ("num_experts_per_tok", "experts_per_token", "moe_top_k"),
    "moe_ffn_hidden_size": ("moe_intermediate_size",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx"),
}
"""The Hugging Face keys (first wins) that give each ModelSpec field, across families."""


def model_from_hf_config(cfg: Any, name: str = "hf-model") -> ModelSpec:
    """Translate a parsed HF config dict into a ModelSpec.

    Raises:
        SpecError: missing or ill-typed keys, or an inconsistent shape.
    """
    if not isinstance(cfg, dict):
        raise SpecError(
            f"config.json must hold a JSON object, got {type(cfg).__name__}",
            field="config.json",
            value=cfg,
            allowed="a JSON object with hidden_size, num_hidden_layers, ...",
        )
    model_type = str(cfg.get("model_type", "")).lower()
    if model_type == "llama4" and isinstance(cfg.get("text_config"), dict):
        cfg = {"model_type": "llama4_text", **cfg["text_config"]}  # the vision tower is ignored
        model_type = "llama4_text"
    hidden = _int(cfg, *_HF_KEYS["hidden_size"], positive=True)
    layers = _int(cfg, *_HF_KEYS["num_layers"], positive=True)
    heads = _int(cfg, *_HF_KEYS["num_attention_heads"], positive=True)
    kv_heads = _int(cfg, *_HF_KEYS["num_kv_heads"], default=heads)
    ffn = _int(cfg, "intermediate_size_mlp", *_HF_KEYS["ffn_hidden_size"], default=4 * hidden)
    vocab = _int(cfg, *_HF_KEYS["vocab_size"], positive=True)
    head_dim = _int(cfg, "head_dim", required=False)
    max_pos = _int(cfg, *_HF_KEYS["max_position_embeddings"], required=False)
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "gelu"))).lower()

    if model_type in _GATED_SILU or (not model_type and act in ("silu", "swish")):
        activation = "swiglu"
    elif model_type in _GATED_GELU:
        activation = "geglu"
    elif "relu2" in act or "squared_relu" in act:
        activation = "squared_relu"
    elif act == "relu":
        activation = "relu"
    else:
        activation = "gelu"

    gpt_style = model_type in ("gpt2", "gpt_neox", "gptj", "gpt_bigcode")
    experts = _int(cfg, *_HF_KEYS["num_experts"], default=0)
    fields: dict[str, Any] = {
        "name": name,
        "family": model_type or None,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim if head_dim and head_dim != hidden // heads else None,
        "ffn_hidden_size": ffn,
        "vocab_size": vocab,
        "activation": activation,
        "norm": "layernorm" if gpt_style else "rmsnorm",
        "position_embedding": "learned" if model_type == "gpt2" else "rope",
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": bool(
            cfg.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)
        ),
        "use_bias": gpt_style,
        "qkv_bias": model_type in ("qwen2", "qwen2_moe") or bool(cfg.get("attention_bias")),
        "sources": [f"Hugging Face config.json (model_type={model_type or 'unknown'})"],
    }
    if experts:
        fields["num_experts"] = experts
        fields["moe_top_k"] = _int(cfg, *_HF_KEYS["moe_top_k"], default=2)
        moe_ffn = _int(cfg, *_HF_KEYS["moe_ffn_hidden_size"], required=False)
        shared = _int(cfg, "n_shared_experts", required=False) or 0
        shared_ffn = _int(cfg, "shared_expert_intermediate_size", required=False)
        if model_type == "qwen2_moe" and shared_ffn and moe_ffn:
            shared = shared_ffn // moe_ffn
        if model_type == "llama4_text":
            # Experts (and the one shared expert, Llama4TextMoe) are intermediate_size wide,
            # dense layers intermediate_size_mlp.
            moe_ffn, shared = _int(cfg, "intermediate_size", positive=True), 1
        if moe_ffn:
            fields["moe_ffn_hidden_size"] = moe_ffn
        fields["num_shared_experts"] = shared
        fields.update(_moe_layout(cfg))
    fields.update(_attention_fields(cfg, model_type, layers))
    factor = _yarn_attention_factor(cfg.get("rope_scaling"))
    if factor is not None:
        fields["rope_attention_factor"] = factor
    if model_type == "gpt_oss":  # biases on q/k/v/o and on every expert (modeling_gpt_oss.py)
        fields["use_bias"] = True
        # GptOssConfig's default limit
        fields["glu_clamp"] = _positive_number(cfg.get("swiglu_limit", 7.0), "swiglu_limit")
    # The authors' active counts leave out the input embedding: stated in the gpt-oss model
    # card (Table 1 caption); DeepSeek-V2's 21B and V3's 36.7B (README_WEIGHTS.md) reproduce
    # only that way (20.85B and 36.63B; with the embedding 21.38B and 37.55B).
    fields["published_active_excludes_embedding"] = model_type in (
        "gpt_oss", "deepseek_v2", "deepseek_v3")
    try:
        return ModelSpec(**fields)
    except ValidationError as exc:
        err = from_validation_error(exc, "config.json")
        # Name the file's own keys, not paraplan's (num_hidden_layers, not num_layers).
        text = str(err)
        for ours, theirs in _HF_KEYS.items():
            present = next((k for k in theirs if k in cfg), None)
            if present:
                text = text.replace(f"config.json.{ours}", f"config.json key {present}")
        raise SpecError(text, field=err.field, value=err.value) from None


def _positive_number(value: Any, key: str) -> float:
    """``value`` of config.json key ``key`` as a float, or a one-line error naming the key
    unless it is a number in (0, 1e6]."""
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 0 < value <= 1_000_000:
        raise SpecError(f"config.json key {key}={short_repr(value)} must be a number > 0",
                        field=key, value=value, allowed="a number > 0")
    return float(value)


def _yarn_attention_factor(scaling: Any) -> float | None:
    """YaRN's attention factor from ``rope_scaling`` as transformers computes it
    (modeling_rope_utils.py ``_compute_yarn_parameters``): ``attention_factor`` if given, else
    get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are given, else
    get_mscale(factor) = 0.1 ln(factor) + 1 (1 for factor <= 1). None: not YaRN."""
    if not isinstance(scaling, dict) or \
            (scaling.get("rope_type") or scaling.get("type")) != "yarn":
        return None

    def number(key: str, default: float | None) -> float | None:
        value = scaling.get(key, default)
        return None if value is None else _positive_number(value, f"rope_scaling.{key}")

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    given = number("attention_factor", None)
    if given is not None:
        return given
    factor = number("factor", 1.0)
    m, m_all = number("mscale", None), number("mscale_all_dim", None)
    if m is not None and m_all is not None:
        return mscale(factor, m) / mscale(factor, m_all)
    return mscale(factor)


def _moe_layout(cfg: dict[str, Any]) -> dict[str, Any]:
    """Which layers are MoE: DeepSeek ``first_k_dense_replace`` / ``moe_layer_freq``, Qwen
    ``decoder_sparse_step`` / ``mlp_only_layers``, Llama 4 ``interleave_moe_layer_step``;
    plus DeepSeek-V3's multi-token-prediction modules."""
    first = _int(cfg, "first_k_dense_replace", default=0)
    freq = _int(cfg, "moe_layer_freq", default=1, positive=True)
    if freq != 1:
        raise SpecError(f"config.json key moe_layer_freq={freq} is not supported; allowed: 1 "
                        "(every layer after first_k_dense_replace is MoE)",
                        field="moe_layer_freq", value=freq, allowed="1")
    step = _int(cfg, "interleave_moe_layer_step", "decoder_sparse_step", default=1,
                positive=True)
    dense_only = cfg.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or any(
            isinstance(i, bool) or not isinstance(i, int) for i in dense_only):
        raise SpecError(f"config.json key mlp_only_layers={short_repr(dense_only)} must be a "
                        "list of layer indices", field="mlp_only_layers", value=dense_only,
                        allowed="a list of integers")
    if dense_only:
        if sorted(dense_only) != list(range(len(dense_only))):
            raise SpecError(f"config.json key mlp_only_layers={short_repr(dense_only)} is "
                            "supported only as leading layers 0..k-1",
                            field="mlp_only_layers", value=dense_only,
                            allowed="[0, 1, ..., k-1]")
        first = max(first, len(dense_only))
    out = {"first_dense_layers": first, "moe_layer_step": step,
           "num_mtp_layers": _int(cfg, "num_nextn_predict_layers", default=0)}
    groups = _int(cfg, "n_group", default=None, required=False)
    pick = _int(cfg, "topk_group", default=None, required=False)
    if groups and pick and groups > 1:  # group-limited routing (DeepSeek-V2/V3)
        out["moe_router_groups"], out["moe_router_group_topk"] = groups, pick
    return out


def _attention_fields(cfg: dict[str, Any], model_type: str, layers: int) -> dict[str, Any]:
    """MLA ranks and head widths, q/k norms, sinks and local (sliding / chunked) layers."""
    out: dict[str, Any] = {}
    if cfg.get("kv_lora_rank") is not None:
        out["kv_lora_rank"] = _int(cfg, "kv_lora_rank", positive=True)
        out["q_lora_rank"] = _int(cfg, "q_lora_rank", required=False, positive=True)
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            out[key] = _int(cfg, key, positive=True)
        out["head_dim"] = None  # MLA widths come from the keys above
        out["num_kv_heads"] = None
    if model_type in _QK_NORM:
        out["qk_norm"] = True
    if model_type == "gpt_oss":
        out["attention_sinks"] = True
    kinds = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    if model_type == "llama4_text" and cfg.get("attention_chunk_size"):
        rope_layers = cfg.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
        out.update(local_attention="chunked",
                   local_attention_window=_int(cfg, "attention_chunk_size", positive=True),
                   local_attention_layers=sum(1 for x in rope_layers if x))
        return out
    if isinstance(kinds, list) and window:
        n_local = sum(1 for k in kinds if k == "sliding_attention")
    elif window and cfg.get("use_sliding_window", model_type in ("mistral", "mixtral")):
        n_local = layers
    else:
        return out
    out.update(local_attention="sliding",
               local_attention_window=_int(cfg, "sliding_window", positive=True),
               local_attention_layers=n_local)
    return out
