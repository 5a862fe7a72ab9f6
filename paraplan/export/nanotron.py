"""nanotron YAML for a plan (keys of ``src/nanotron/config/parallelism_config.py`` and
``config.py``; recorded in ``tests/data/trainer_keys/nanotron.txt``).

The file holds ``parallelism``, ``tokens``, ``optimizer.zero_stage`` and the model shape
(``model.model_config``, Llama-style keys); merge it into a full nanotron config (data,
optimizer, checkpoints, ``tokens.train_steps``).

Rules checked before writing: ``global_batch = micro_batch_size *
batch_accumulation_per_replica * dp`` (nanotron's ``global_batch_size`` property); 1F1B needs
``batch_accumulation_per_replica >= pp - 1``; nanotron splits layers evenly with one chunk per
stage and runs ZeRO-0 or ZeRO-1 only.
"""

from __future__ import annotations

from typing import Any

import yaml

from paraplan.export.common import (
    ExportContext,
    ExportError,
    refuse,
    refuse_optimizer_state,
    refuse_relaxed_sync,
)

TRAINER = "nanotron"
VERSION = "config keys recorded 2026-11"


def nanotron_config(ctx: ExportContext) -> dict[str, Any]:
    """The plan as a nanotron config dict.

    Raises:
        ExportError: a rule is broken or the plan uses something nanotron cannot express.
    """
    m, t, p = ctx.model, ctx.training, ctx.plan
    _check(ctx)
    accumulation = ctx.num_microbatches
    if p.micro_batch_size * accumulation * ctx.dp != t.global_batch_size:
        raise ExportError(f"nanotron's batch identity fails: {t.global_batch_size} != "
                          f"{p.micro_batch_size} * {accumulation} * dp {ctx.dp}",
                          field="training.global_batch_size", value=t.global_batch_size)
    parallelism: dict[str, Any] = {
        "dp": ctx.dp, "pp": p.pp, "tp": p.tp,
        "pp_engine": "afab" if p.schedule == "gpipe" else "1f1b",
        "tp_mode": "REDUCE_SCATTER" if p.sequence_parallel else "ALL_REDUCE",
        "tp_linear_async_communication": bool(p.tp_comm_overlap),
        "recompute_layer": p.recompute == "full",
    }
    model_config: dict[str, Any] = {
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.kv_heads,
        "num_hidden_layers": m.num_layers,
        "vocab_size": m.vocab_size,
        "tie_word_embeddings": m.tie_word_embeddings,
        "max_position_embeddings": max(t.seq_len, m.max_position_embeddings or 0),
    }
    return {
        "parallelism": parallelism,
        "tokens": {"sequence_length": t.seq_len, "micro_batch_size": p.micro_batch_size,
                   "batch_accumulation_per_replica": accumulation},
        # fp32 gradient accumulation and reduction, as nanotron's examples set it (and as the
        # nanotron trainer profile prices it): src/nanotron/helpers.py FP32GradientAccumulator.
        "optimizer": {"zero_stage": p.zero_stage, "accumulate_grad_in_fp32": True},
        "model": {"model_config": model_config},
    }


def _check(ctx: ExportContext) -> None:
    m, p = ctx.model, ctx.plan
    refuse_relaxed_sync(ctx.plan, TRAINER)
    refuse_optimizer_state(ctx.training, TRAINER)
    if p.zero_stage > 1:
        raise refuse("zero_stage", p.zero_stage, TRAINER, "nanotron shards optimizer states "
                     "only (zero_stage 0 or 1)")
    if p.virtual_stages > 1 or p.schedule in ("interleaved", "zb-h1"):
        raise refuse("schedule", p.schedule, TRAINER, "nanotron's pipeline engines are 1f1b "
                     "and afab, one chunk per stage")
    if not ctx.even:
        raise refuse("layers_per_stage", ctx.chunk_layers, TRAINER, "nanotron splits the "
                     "layers evenly over the pipeline stages")
    if p.pp > 1 and p.schedule == "1f1b" and ctx.num_microbatches < p.pp - 1:
        raise refuse("micro_batch_size", p.micro_batch_size, TRAINER,
                     f"1F1B needs batch_accumulation_per_replica >= pp - 1 = {p.pp - 1}; this "
                     f"plan has {ctx.num_microbatches}")
    if p.recompute in ("selective", "op", "layer"):
        raise refuse("recompute", p.recompute, TRAINER, "recompute_layer recomputes whole "
                     "layers (recompute=full) or nothing")
    if m.is_moe:
        raise refuse("model.num_experts", m.num_experts, TRAINER, "the Llama model_config "
                     "written here has no experts; export MoE plans to megatron or torchtitan")
    if p.cp > 1:
        raise refuse("cp", p.cp, TRAINER, "nanotron's Llama model has no context parallelism "
                     "(context_parallel_size is read only by its Qwen2 attention, "
                     "models/qwen.py); use cp=1 or export to megatron or torchtitan")


def nanotron_yaml(ctx: ExportContext, header: list[str]) -> str:
    """The YAML text (``yaml.safe_dump``, keys in nanotron's order)."""
    body = yaml.safe_dump(nanotron_config(ctx), sort_keys=False, default_flow_style=False)
    return "".join(f"# {h}\n" for h in header) + body
