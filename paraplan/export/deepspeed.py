"""DeepSpeed config JSON for a plan (keys of ``deepspeed/runtime/constants.py``,
``runtime/zero/config.py``, ``runtime/activation_checkpointing/config.py`` and the
``pipeline`` block of ``runtime/config.py``; recorded in
``tests/data/trainer_keys/deepspeed.txt``).

Rules checked before writing: the batch identity DeepSpeed asserts
(``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps *
data-parallel world``, ``_batch_assertion``), and ZeRO-2/3 are refused with pipeline
parallelism (DeepSpeed's pipeline engine supports ZeRO-0/1 only). What the JSON cannot say
is refused by name rather than dropped: Megatron sequence parallelism, ring context
parallelism (DeepSpeed's ``sequence_parallel_size`` is Ulysses all-to-all), expert
parallelism (set in the model's ``deepspeed.moe.layer.MoE(ep_size=...)``), uneven or
interleaved pipeline splits, and selective recomputation.
"""

from __future__ import annotations

import json
from typing import Any

from paraplan.export.common import (
    ExportContext,
    ExportError,
    refuse,
    refuse_optimizer_state,
    refuse_relaxed_sync,
)

TRAINER = "DeepSpeed"
VERSION = "config keys recorded 2026-11"


def deepspeed_config(ctx: ExportContext) -> dict[str, Any]:
    """The plan as a DeepSpeed config dict.

    Raises:
        ExportError: a rule is broken or the plan uses something the JSON cannot express.
    """
    t, p = ctx.training, ctx.plan
    _check(ctx)
    gas = ctx.num_microbatches
    config: dict[str, Any] = {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": gas,
    }
    if config["train_batch_size"] != p.micro_batch_size * gas * ctx.dp:
        raise ExportError(f"DeepSpeed's batch identity fails: {t.global_batch_size} != "
                          f"{p.micro_batch_size} * {gas} * dp {ctx.dp}",
                          field="training.global_batch_size", value=t.global_batch_size)
    if t.precision == "bf16":
        config["bf16"] = {"enabled": True}
        # fp32 accumulation selects the BF16 optimizer for ZeRO-0/1 (what the deepspeed
        # profile prices); with ZeRO on, DeepSpeed's default is bf16 accumulation in the ZeRO
        # optimizer (runtime/engine.py get_data_types, _do_optimizer_sanity_check at
        # 38327e0), kept for a run that accumulates so (as an imported config without
        # data_types runs).
        bf16_accum = t.grad_accumulation == "eager" and p.zero_stage >= 1
        config["data_types"] = {"grad_accum_dtype": "bf16" if bf16_accum else "fp32"}
    elif t.precision == "fp16":
        config["fp16"] = {"enabled": True}
    config["zero_optimization"] = {
        "stage": p.zero_stage,
        "overlap_comm": bool(p.overlap_grad_reduce),
        "contiguous_gradients": True,
        "reduce_scatter": True,
    }
    if t.ddp_bucket_size is not None:
        config["zero_optimization"]["reduce_bucket_size"] = t.ddp_bucket_size
    if p.tp > 1:
        config["tensor_parallel"] = {"autotp_size": p.tp}
    if p.pp > 1:
        config["pipeline"] = {"stages": p.pp, "partition": "uniform",
                              "activation_checkpoint_interval": 1 if p.recompute == "full"
                              else 0}
    if p.recompute == "full":
        config["activation_checkpointing"] = {
            "partition_activations": p.tp > 1, "contiguous_memory_optimization": False,
            "cpu_checkpointing": False, "synchronize_checkpoint_boundary": False}
    return config


def _check(ctx: ExportContext) -> None:
    t, p = ctx.training, ctx.plan
    refuse_relaxed_sync(ctx.plan, TRAINER)
    refuse_optimizer_state(ctx.training, TRAINER)
    if p.pp > 1 and p.zero_stage >= 2:
        raise refuse("zero_stage", p.zero_stage, TRAINER, "DeepSpeed's pipeline engine runs "
                     "ZeRO-0 or ZeRO-1 only")
    if p.sequence_parallel:
        raise refuse("sequence_parallel", True, TRAINER, "the config JSON has no Megatron "
                     "sequence parallelism (Megatron-DeepSpeed's --sequence-parallel flag); "
                     "export to megatron, or use sequence_parallel=false")
    if p.cp > 1:
        raise refuse("cp", p.cp, TRAINER, "DeepSpeed's sequence_parallel_size is Ulysses "
                     "all-to-all attention, not ring context parallelism")
    if p.ep > 1:
        raise refuse("ep", p.ep, TRAINER, "expert parallelism is set in the model "
                     "(deepspeed.moe.layer.MoE(ep_size=...)), not in the config JSON")
    if p.pp > 1 and (p.virtual_stages > 1 or not ctx.even):
        raise refuse("layers_per_stage" if not ctx.even else "virtual_stages",
                     p.layers_per_stage if not ctx.even else p.virtual_stages, TRAINER,
                     "the pipeline block splits layers uniformly with one chunk per stage")
    if p.pp > 1 and p.schedule != "1f1b":
        raise refuse("schedule", p.schedule, TRAINER, "DeepSpeed's pipeline engine runs 1F1B")
    if p.recompute in ("selective", "op", "layer"):
        raise refuse("recompute", p.recompute, TRAINER, "DeepSpeed checkpoints whole layers "
                     "(recompute=full) or none")
    if t.precision == "fp8":
        raise refuse("training.precision", "fp8", TRAINER, "bf16, fp16 or fp32")


def deepspeed_json(ctx: ExportContext, header: list[str]) -> str:
    """The JSON text. JSON has no comments and every key must be one DeepSpeed reads, so the
    provenance in ``header`` is not written here (``paraplan export`` writes it to the plan
    JSON next to this file)."""
    del header
    return json.dumps(deepspeed_config(ctx), indent=2) + "\n"
