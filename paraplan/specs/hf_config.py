"""Build a ModelSpec from a Hugging Face ``config.json`` (read as data, never executed).

Supported styles: Llama, Mistral, Mixtral, Qwen2 (and Qwen2-MoE), Gemma, DeepSeek-MoE,
GPT-NeoX and GPT-2. Keys follow each family's ``configuration_*.py`` in transformers;
defaults below are those classes' defaults (e.g. Llama ties embeddings only when asked,
GPT-2 always ties).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from paraplan.specs.errors import SpecError, from_validation_error, short_repr
from paraplan.specs.model import ModelSpec

# Families whose MLP is gated (3 matrices) with a SiLU/GELU gate.
_GATED_SILU = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "deepseek", "qwen3", "olmo"}
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
    "moe_top_k": ("num_experts_per_tok", "moe_top_k"),
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
    hidden = _int(cfg, *_HF_KEYS["hidden_size"], positive=True)
    layers = _int(cfg, *_HF_KEYS["num_layers"], positive=True)
    heads = _int(cfg, *_HF_KEYS["num_attention_heads"], positive=True)
    kv_heads = _int(cfg, *_HF_KEYS["num_kv_heads"], default=heads)
    ffn = _int(cfg, *_HF_KEYS["ffn_hidden_size"], default=4 * hidden)
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
        if moe_ffn:
            fields["moe_ffn_hidden_size"] = moe_ffn
        shared = _int(cfg, "n_shared_experts", required=False) or 0
        shared_ffn = _int(cfg, "shared_expert_intermediate_size", required=False)
        if model_type == "qwen2_moe" and shared_ffn and moe_ffn:
            shared = shared_ffn // moe_ffn
        fields["num_shared_experts"] = shared
        fields["first_dense_layers"] = _int(cfg, "first_k_dense_replace", default=0)
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

