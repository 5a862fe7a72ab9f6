"""What the simulator sees of an executor run: the tiny GPT as a ``ModelSpec``, the run as a
``TrainingSpec`` and its plan as a ``ParallelPlan`` (and back).

The executor's GPT is GPT-2 shaped: LayerNorm, GELU MLP, biases on every projection, learned
positions (one per token of ``seq_len``), an untied LM head, fp32 everywhere, a bias-free
router. ``model_spec`` maps it field by field, so ``ModelSpec.num_params`` equals the
executor's parameter count exactly (tested); ``config_from_model_spec`` refuses any model
the executor cannot build, naming the field.
"""

from __future__ import annotations

from typing import Any

from paraplan.executor.model import TinyGPTConfig
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec


def model_spec(cfg: TinyGPTConfig, name: str = "executor-gpt") -> ModelSpec:
    """The ``ModelSpec`` of the executor's GPT ``cfg`` (same parameter count)."""
    return ModelSpec(
        name=name, num_layers=cfg.num_layers, hidden_size=cfg.hidden,
        num_attention_heads=cfg.heads, num_kv_heads=cfg.kv_heads,
        ffn_hidden_size=cfg.ffn_hidden, vocab_size=cfg.vocab, activation="gelu",
        norm="layernorm", position_embedding="learned", max_position_embeddings=cfg.seq_len,
        tie_word_embeddings=False, use_bias=True, num_experts=cfg.num_experts,
        moe_top_k=cfg.top_k if cfg.num_experts else 0)


def config_from_model_spec(spec: ModelSpec, seq_len: int, seed: int = 0) -> TinyGPTConfig:
    """The executor GPT for ``spec`` at ``seq_len`` tokens.

    Raises:
        SpecError: ``spec`` has a feature the executor does not build (the message names the
            field, its value and what the executor needs).
    """
    need = {"activation": "gelu", "norm": "layernorm", "position_embedding": "learned",
            "tie_word_embeddings": False, "use_bias": True, "embedding_layernorm": False,
            "num_shared_experts": 0, "first_dense_layers": 0, "head_dim": None,
            "moe_ffn_hidden_size": None}
    for field, want in need.items():
        got = getattr(spec, field)
        if got != want and not (field == "head_dim" and got == spec.head_size):
            raise SpecError(f"model.{field}={got!r} cannot run on the executor, which builds "
                            f"GPT-2-style blocks; it needs {field}={want!r}",
                            field=f"model.{field}")
    if spec.max_position_embeddings not in (None, seq_len) and \
            spec.max_position_embeddings < seq_len:
        raise SpecError(f"model.max_position_embeddings={spec.max_position_embeddings} is "
                        f"below seq_len={seq_len}", field="model.max_position_embeddings")
    return TinyGPTConfig(num_layers=spec.num_layers, hidden=spec.hidden_size,
                         heads=spec.num_attention_heads, kv_heads=spec.kv_heads,
                         seq_len=seq_len, vocab=spec.vocab_size,
                         ffn_hidden=spec.ffn_hidden_size, num_experts=spec.num_experts,
                         top_k=spec.moe_top_k or 1, seed=seed)


def training_spec(config: dict[str, Any]) -> TrainingSpec:
    """The ``TrainingSpec`` of a ``train_worker`` config: fp32, eager kernels, fused attention
    (``scaled_dot_product_attention`` runs a flash kernel on CPU and on GPU, keeping no
    s x s scores), the config's optimizer."""
    optimizer = config.get("optimizer", "adamw")
    return TrainingSpec(global_batch_size=int(config["global_batch_size"]),
                        seq_len=int(config["model"]["seq_len"]), precision="fp32",
                        optimizer=optimizer, master_weights=False, flash_attention=True,
                        kernels="eager")


def simulator_plan(config: dict[str, Any], world_size: int) -> ParallelPlan:
    """The ``ParallelPlan`` the executor runs for ``config["plan"]`` on ``world_size`` ranks:
    dp resolved, gradients reduced after the backward pass (no overlap), and MoE all-to-all
    buffers padded to ``ep`` (the executor's dropless capacity)."""
    raw = dict(config["plan"])
    tp, pp = int(raw.get("tp", 1)), int(raw.get("pp", 1))
    raw["dp"] = int(raw.get("dp") or world_size // (tp * pp))
    if raw.get("schedule") == "afab":
        raw["schedule"] = "gpipe"
    ep = int(raw.get("ep", 1))
    if ep > 1 and config["model"].get("num_experts"):
        raw["moe_capacity_factor"] = float(ep)
    raw.setdefault("schedule", "1f1b")
    raw["overlap_grad_reduce"] = False
    return ParallelPlan(**{k: v for k, v in raw.items() if v is not None})
